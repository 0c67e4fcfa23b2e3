"""`BLOCK.KEY=VALUE` settings written into a spec's text (what `msgen plan --write`
saves): a key's value is replaced where it stands, so its comment stays; a key the
block lacks goes at the block's end; a block the spec lacks at the file's end. The
caller formats the result (`msgen fmt`'s layout).

A spec saved in another folder keeps reading the files it names: the paths that are
relative to the spec's folder (`hccn("...")`) are rebased. Data paths are relative to
where train.py runs (generated/<model>/), not to the spec, and stay as written.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from msgen.diagnostics import Span
from msgen.syntax import ast
from msgen.syntax.parser import parse


def line_starts(text: str) -> list[int]:
    """The offset of the first character of each line as the lexer counts lines:
    ended by `\\n` alone (str.splitlines also breaks at \\f, \\x85, U+2028 and more,
    which MSL allows in comments and strings), plus the end of the text."""
    starts = [0]
    at = text.find("\n")
    while at != -1:
        starts.append(at + 1)
        at = text.find("\n", at + 1)
    return starts + [len(text)]


def lines_with_ends(text: str) -> list[str]:
    """The text's lines, each with its `\n`, as the lexer counts them (for diffs whose
    line numbers must be the ones diagnostics give)."""
    starts = line_starts(text)
    return [text[a:b] for a, b in zip(starts, starts[1:], strict=False) if a < b]


def _strings_read(module: ast.Module):
    """The string literals that name a file relative to the spec: `hccn("path")`."""

    def walk(node):
        if isinstance(node, ast.Call) and node.func.name == "hccn":
            yield from (a for a in node.args if isinstance(a, ast.String))
        for child in getattr(node, "items", ()) or ():
            yield from walk(child)

    for block in module.blocks:
        if block.kind.name == "cluster":
            for stmt in block.stmts:
                if isinstance(stmt, ast.Assign) and stmt.target.name == "device_ips":
                    yield from walk(stmt.value)


def rebased(spec_dir: Path, out_dir: Path) -> Callable[[str], str]:
    """A spec-relative path as seen from `out_dir` (absolute paths stay as written)."""

    def move(path: str) -> str:
        if os.path.isabs(path):
            return path
        target = spec_dir.resolve() / path
        return Path(os.path.relpath(target, out_dir.resolve())).as_posix()

    return move


def write_settings(
    text: str,
    settings: list[str],
    file: str = "<spec>",
    move: Callable[[str], str] | None = None,
) -> str:
    """`text` with each `BLOCK.KEY=VALUE` of `settings` written into it, and each path
    it reads passed through `move`. The text must parse (it is a spec that checked);
    later settings of one key win. ValueError when a moved path cannot be a string."""
    module, diags = parse(text, file)
    if module is None:
        raise ValueError(f"{file} does not parse: {[d.message for d in diags]}")
    starts = line_starts(text)

    def offset(line: int, col: int) -> int:
        return starts[line - 1] + col - 1

    def where(span: Span) -> tuple[int, int]:
        return offset(span.line, span.col), offset(span.end_line, span.end_col)

    replace: dict[tuple[int, int], str] = {}  # (start, end) of a value -> new text
    insert: dict[int, dict[str, str]] = {}  # offset of a block's `}` -> key -> new line
    new_blocks: dict[str, dict[str, str]] = {}
    for string in _strings_read(module) if move else ():
        path = move(string.value)
        if '"' in path or "\n" in path:
            raise ValueError(f"the path {path!r} cannot be written as an MSL string")
        replace[where(string.span)] = f'"{path}"'
    for item in settings:
        path, _, value = item.partition("=")
        block_kind, _, key = path.strip().partition(".")
        key, value = key.strip(), value.strip()
        block = next((b for b in module.blocks if b.kind.name == block_kind), None)
        if block is None:
            new_blocks.setdefault(block_kind, {})[key] = f"    {key} = {value}\n"
            continue
        stmt = next(
            (s for s in block.stmts if isinstance(s, ast.Assign) and s.target.name == key), None
        )
        if stmt is not None:
            replace[where(stmt.value.span)] = value
            continue
        brace = offset(block.span.end_line, block.span.end_col) - 1
        insert.setdefault(brace, {})[key] = f"\n    {key} = {value}\n"
    edits = [(start, end, new) for (start, end), new in replace.items()]
    edits += [(at, at, "".join(lines.values())) for at, lines in insert.items()]
    out = text
    for start, end, new in sorted(edits, reverse=True):
        out = out[:start] + new + out[end:]
    for kind, lines in new_blocks.items():
        out = out.rstrip("\n") + f"\n\n{kind} {{\n{''.join(lines.values())}}}\n"
    return out
