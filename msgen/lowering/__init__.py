"""AST to IR: dims evaluated, ops resolved against their signatures, defaults filled in."""
