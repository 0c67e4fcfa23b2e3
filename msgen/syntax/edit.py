"""`BLOCK.KEY=VALUE` settings written into a spec's text (what `msgen plan --write`
saves): a key's value is replaced where it stands, so its comment stays; a key the
block lacks goes at the block's end; a block the spec lacks at the file's end. The
caller formats the result (`msgen fmt`'s layout)."""

from __future__ import annotations

from msgen.diagnostics import Span
from msgen.syntax import ast
from msgen.syntax.parser import parse


def _offsets(text: str) -> list[int]:
    """The offset of the first character of each line (1-based line n at index n - 1)."""
    starts, at = [], 0
    for line in text.splitlines(keepends=True):
        starts.append(at)
        at += len(line)
    return starts + [at]


def write_settings(text: str, settings: list[str], file: str = "<spec>") -> str:
    """`text` with each `BLOCK.KEY=VALUE` of `settings` written into it. The text must
    parse (it is a spec that checked); later settings of one key win."""
    module, diags = parse(text, file)
    if module is None:
        raise ValueError(f"{file} does not parse: {[d.message for d in diags]}")
    starts = _offsets(text)

    def offset(line: int, col: int) -> int:
        return starts[line - 1] + col - 1

    replace: dict[tuple[int, int], str] = {}  # (start, end) of a value -> new text
    insert: dict[int, list[str]] = {}  # offset of a block's `}` -> new lines
    new_blocks: dict[str, list[str]] = {}
    for item in settings:
        path, _, value = item.partition("=")
        block_kind, _, key = path.strip().partition(".")
        value = value.strip()
        block = next((b for b in module.blocks if b.kind.name == block_kind), None)
        if block is None:
            new_blocks.setdefault(block_kind, []).append(f"    {key} = {value}\n")
            continue
        stmt = next(
            (s for s in block.stmts if isinstance(s, ast.Assign) and s.target.name == key), None
        )
        if stmt is not None:
            span: Span = stmt.value.span
            replace[(offset(span.line, span.col), offset(span.end_line, span.end_col))] = value
            continue
        brace = offset(block.span.end_line, block.span.end_col) - 1
        insert.setdefault(brace, []).append(f"\n    {key} = {value}\n")
    edits = [(start, end, new) for (start, end), new in replace.items()]
    edits += [(at, at, "".join(lines)) for at, lines in insert.items()]
    out = text
    for start, end, new in sorted(edits, reverse=True):
        out = out[:start] + new + out[end:]
    for kind, lines in new_blocks.items():
        out = out.rstrip("\n") + f"\n\n{kind} {{\n{''.join(lines)}}}\n"
    return out
