"""`--set block.key=value`: what-if edits applied to the AST, so the edited spec
is lowered and checked exactly like one written that way."""

from __future__ import annotations

import dataclasses

from msgen.diagnostics import Diagnostic, did_you_mean, error, printable
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
    module: ast.Module, overrides: list[str], known: dict[str, tuple[str, ...]] | None = None
) -> tuple[ast.Module, list[Diagnostic]]:
    """The module with each `BLOCK.KEY=VALUE` in place. In a block of `known` (the
    model's keys: there a new name is a free dim) a key that is neither known nor
    already in the spec is refused: a what-if must not add a dim that nothing uses
    (`--set model.hiden=4096`) and report an unchanged estimate."""
    diags: list[Diagnostic] = []
    blocks = list(module.blocks)
    seen: set[str] = set()
    for text in overrides:
        kind, stmt, found = _parse_override(text)
        diags += found
        if stmt is None:
            continue
        key = f"{kind}.{stmt.target.name}"
        if key in seen:
            # the last one winning would make the flags' order matter
            diags.append(error("MSL001", f"--set {key} is given twice", None))
            continue
        seen.add(key)
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
        name = stmt.target.name
        if at is None and kind in (known or {}) and name not in known[kind]:
            defined = [s.target.name for s in stmts if isinstance(s, ast.Assign)]
            diags.append(
                error(
                    "MSL104",
                    f"--set {key}: `{kind}` has no `{name}`",
                    stmt.target.span,
                    did_you_mean(name, [*known[kind], *defined]),
                )
            )
            continue
        if at is None:
            stmts.append(stmt)
        else:
            stmts[at] = stmt
        blocks[index] = dataclasses.replace(block, stmts=tuple(stmts))
    return dataclasses.replace(module, blocks=tuple(blocks)), diags


def override_keys(overrides: list[str]) -> set[str]:
    """The `BLOCK.KEY` each well-formed override sets."""
    keys = set()
    for text in overrides:
        path = text.partition("=")[0].strip()
        block, _, key = path.partition(".")
        keys.add(f"{block}.{key.strip()}")
    return keys


def recorded(overrides: list[str]) -> tuple[str, ...]:
    """The overrides as a compiled tree records them: `BLOCK.KEY=VALUE` with the space
    around the key and the value dropped, sorted (a key is given once, so their order
    means nothing)."""
    out = []
    for text in overrides:
        path, _, value = text.partition("=")
        block, _, key = path.partition(".")
        out.append(f"{block.strip()}.{key.strip()}={value.strip()}")
    return tuple(sorted(out))


def flags(sets: tuple[str, ...]) -> str:
    """`--set a=1 --set b=2` as a command line gives recorded flags, printably ("" for
    none)."""
    return " ".join(f"--set {printable(s)}" for s in sets)
