"""`--set block.key=value`: what-if edits applied to the AST, so the edited spec
is lowered and checked exactly like one written that way."""

from __future__ import annotations

import dataclasses

from msgen.diagnostics import Diagnostic, error
from msgen.syntax import ast
from msgen.syntax.parser import parse

SOURCE = "<--set>"


def _parse_override(text: str) -> tuple[str, ast.Assign | None, list[Diagnostic]]:
    path, sep, value = text.partition("=")
    block, dot, key = path.strip().partition(".")
    if not sep or not dot or not block or not key:
        return "", None, [error("MSL001", f"--set takes BLOCK.KEY=VALUE, got {text!r}", None)]
    module, diags = parse(f"{block} {{\n{key} = {value.strip()}\n}}\n", SOURCE)
    if module is None or len(module.blocks) != 1 or len(module.blocks[0].stmts) != 1:
        return block, None, diags or [error("MSL001", f"cannot read --set {text!r}", None)]
    return block, module.blocks[0].stmts[0], []


def apply_overrides(
    module: ast.Module, overrides: list[str]
) -> tuple[ast.Module, list[Diagnostic]]:
    diags: list[Diagnostic] = []
    blocks = list(module.blocks)
    for text in overrides:
        kind, stmt, found = _parse_override(text)
        diags += found
        if stmt is None:
            continue
        index = next((i for i, b in enumerate(blocks) if b.kind.name == kind), None)
        if index is None:
            kind_name = ast.Name(stmt.span, kind)
            blocks.append(ast.Block(stmt.span, kind_name, None, (stmt,)))
            continue
        block = blocks[index]
        # replaced in place, so dims defined below it still see it
        stmts = list(block.stmts)
        at = next(
            (i for i, s in enumerate(stmts)
             if isinstance(s, ast.Assign) and s.target.name == stmt.target.name),
            None,
        )  # fmt: skip
        if at is None:
            stmts.append(stmt)
        else:
            stmts[at] = stmt
        blocks[index] = dataclasses.replace(block, stmts=tuple(stmts))
    return dataclasses.replace(module, blocks=tuple(blocks)), diags
