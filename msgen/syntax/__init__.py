"""Text to AST: the grammar, the post-lexer and the dataclass tree with spans."""

from msgen.syntax.parser import parse, read_source

__all__ = ["parse", "read_source"]
