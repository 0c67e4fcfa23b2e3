"""`msgen fmt`: print a spec in the one canonical layout, comments kept.

The formatter prints the AST (so what it writes parses to the same tree) and takes
from the original text only what the tree does not hold: where comments and blank
lines were, where the user broke a bracketed list, and the column of each trailing
comment. Number texts come from the tokens (`3e-4` stays `3e-4`).

Layout rules (specs/gpt7b.msl, the DESIGN.md example, is a fixed point of them):

- `msl 0.1` comes first (after the comments that open the file), then the blocks,
  one blank line between top-level items; no blank lines at the start or the end of
  the file, which ends in one newline.
- `kind [name] {`, one statement per line indented 4 spaces, `}` alone on its line;
  an empty block is `kind {}`.
- Inside a block, blank lines stay where the user put them, at most one in a row;
  blank lines right after `{` or right before `}` go.
- A run is the statements between two blank lines (comment lines do not end it, as
  in gofmt, so a comment between two aligned statements keeps them aligned). In a
  run the `=` of every `key = value` (and `allreduce name = [...]`) statement is
  aligned by padding the left side; `input x : [...]` and `output ...` take no part
  in the alignment (their keywords already line them up) and do not end a run.
- One space around binary operators, `=` (also in keyword arguments) and `@`;
  `, ` between items; `name(args)` and `[items]` without inner spaces; strings in
  double quotes. Parentheses only where precedence needs them:
  `(heads + 2 * kv_heads) * head_dim`, `a - (b - c)`, `-(a * b)`.
- A list or call on one source line stays on one line. One the user broke keeps
  the user's breaks between items: if the first item was on the line after the
  bracket, each source line of items becomes a line indented 4 more than the line
  the bracket opened on, every item is followed by a comma, and the closing bracket
  gets a line of its own; otherwise later lines align with the first item and the
  bracket closes after the last one. Breaks anywhere else (inside an expression or
  the parentheses around it, backslash continuations) are joined.
- Full-line comments are indented to the level of the code that follows them (the
  block's statements, or the items of the list they sit in). A trailing comment stays
  on its line and keeps its source column, moved left only as far as the code before
  it moved left, and right only as far as needed to leave two spaces after the code.
  Trailing comments of one run that shared a source column share one column in the
  output (so the aligned comments of the DESIGN example stay as they are, and stay
  aligned when a longer key pushes them right). A comment-only line right under a
  trailing comment, starting in the same column, continues it and stays under it.
  Where lines are joined, the last trailing comment of the joined line stays on it;
  the others move above it. Top-level comments start in column 0; a blank line
  always separates them from the block before, and one between a comment and the
  block after is kept if the user wrote it.
- Lines end in `\n` and carry no trailing whitespace.

Before returning, the output is parsed again and must give the same tree (spans
aside) and the same comments in the same order; otherwise fmt reports an internal
error rather than write a spec that means something else.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from msgen.syntax import ast, parse
from msgen.syntax.fmt_print import INDENT, FormatError, Printer, Row, left_side
from msgen.syntax.fmt_source import Comment, Source


@dataclass
class _State:
    """Where a sequence of units and gaps stands."""

    blank: bool = False  # a blank line is pending
    started: bool = False  # something was written (blank lines before it are dropped)
    after_item: bool = False  # a top-level item was just written: a blank line follows
    run: int | None = None  # the current run's alignment group


class _Formatter:
    def __init__(self, module: ast.Module, text: str):
        self.module = module
        self.src = Source(module, text)  # what the tree does not hold
        self.out: list[Row] = []
        self.placed = 0  # comments written, checked against the total at the end
        self.groups = 0

    def new_group(self) -> int:
        self.groups += 1
        return self.groups

    # placing comments

    def comment_rows(self, head: Comment, indent: int) -> None:
        for c in [head, *head.chain]:
            self.out.append(Row("comment", indent, c.text))
            self.placed += 1

    def emit(self, rows: list[Row], group: int) -> None:
        """Append a unit's rows, giving each the comments of its source lines: the
        last trailing comment of a row stays on it, others move above it, and a
        comment between two of the unit's lines goes above the later one."""
        spans = [(r.first, r.last) for r in rows if r.first is not None]
        above: list[list[Comment]] = [[] for _ in rows]
        on: list[list[Comment]] = [[] for _ in rows]
        if spans:
            lo, hi = min(f for f, _ in spans), max(last for _, last in spans)
            heads = [self.src.comments.get(line) for line in range(lo, hi + 1)]
            for c in [c for c in heads if c is not None and c.kind != "cont"]:
                mine = [i for i, r in enumerate(rows) if r.first is not None and r.first <= c.line]
                i = mine[-1]
                if c.line <= rows[i].last:
                    on[i].append(c)
                else:
                    later = [
                        j for j, r in enumerate(rows) if r.first is not None and r.first > c.line
                    ]
                    above[later[0]].append(c)
        for i, row in enumerate(rows):
            mine = on[i]
            if mine and mine[-1].kind == "trailing":
                row.chain = mine.pop()
            for c in above[i] + mine:  # both in line order, and the gap comes first
                self.comment_rows(c, row.cindent)
            row.group = group
            self.out.append(row)
            if row.chain is not None:
                self.placed += 1 + len(row.chain.chain)

    def gap(self, first: int, last: int, indent: int, state: _State) -> None:
        """Lines between two units: blank lines (at most one in a row, none at the
        start of a block or file) and full-line comments."""
        for line in range(first, last + 1):
            if self.src.blank(line):
                state.blank = state.started
                continue
            comment = self.src.comments.get(line)
            if comment is not None and comment.kind == "cont":
                continue  # written under its head
            if comment is not None and comment.kind == "standalone":
                state.blank = state.blank or state.after_item
                self.flush_blank(state)
                self.comment_rows(comment, indent)
                state.started, state.after_item = True, False
                continue
            # Code outside any unit: only a second version line, which the tree
            # drops. Keep it as written rather than lose it.
            src = self.src.lines[line - 1]
            code = (src[: comment.col] if comment else src).strip()
            state.blank = state.blank or state.after_item
            self.flush_blank(state)
            rows = [Row("code", indent, code, line, line, cindent=indent)]
            self.emit(rows, self.new_group())
            state.started, state.after_item = True, True
            state.run = None

    def flush_blank(self, state: _State) -> None:
        if state.blank:
            self.out.append(Row("blank"))
            state.blank = False
            state.run = None

    # units

    def version(self, version: ast.Version) -> None:
        p = Printer(0, self.src)
        p.node(version.keyword.name, version.keyword)
        p.put(" ")
        p.node(version.number.text, version.number)
        self.emit(p.rows, self.new_group())

    def block(self, block: ast.Block) -> None:
        header = Printer(0, self.src)
        header.node(block.kind.name, block.kind)
        if block.name is not None:
            header.put(" ")
            header.node(block.name.name, block.name)
        open_line, close_line = self.src.brackets((block.name or block.kind).span)
        stmts = block.stmts
        inside = [self.src.comments.get(line) for line in range(open_line + 1, close_line)]
        if not stmts and not any(c and c.kind == "standalone" for c in inside):
            header.put(" {}", open_line, close_line)
            self.emit(header.rows, self.new_group())
            return
        header.put(" {", open_line)
        if stmts and stmts[0].span.line == open_line:
            # `{ a = 1`: the line, and its comment, belong to the statement.
            header.row.first = header.row.last = None
        self.emit(header.rows, self.new_group())
        widths = self.widths(block, open_line)
        state = _State()
        prev = open_line
        for stmt, width in zip(stmts, widths):
            self.gap(prev + 1, stmt.span.line - 1, INDENT, state)
            self.flush_blank(state)
            if state.run is None:
                state.run = self.new_group()
            p = Printer(INDENT, self.src)
            p.stmt(stmt, width)
            self.emit(p.rows, state.run)
            state.started = True
            prev = self.src.end(stmt)
        self.gap(prev + 1, close_line - 1, INDENT, state)
        # A blank line still pending here would come right before `}`: dropped.
        close = Row("code", 0, "}", cindent=INDENT)
        if close_line > prev:
            close.take(close_line, close_line)
        self.emit([close], self.new_group())

    def widths(self, block: ast.Block, open_line: int) -> list[int]:
        """Per statement, the width its left side is padded to: the widest in its run."""
        runs: list[list[int]] = [[]]
        prev = open_line
        for i, stmt in enumerate(block.stmts):
            between = range(prev + 1, stmt.span.line)
            if runs[-1] and any(self.src.blank(line) for line in between):
                runs.append([])
            runs[-1].append(i)
            prev = self.src.end(stmt)
        widths = [0] * len(block.stmts)
        for run in runs:
            lefts = [left_side(block.stmts[i]) for i in run]
            width = max((len(s) for s in lefts if s is not None), default=0)
            for i, s in zip(run, lefts):
                widths[i] = width if s is not None else 0
        return widths

    def run(self) -> str:
        module = self.module
        items: list[ast.Version | ast.Block] = sorted(
            [*module.blocks, *([module.version] if module.version else [])],
            key=lambda n: n.span.line,
        )
        state = _State()
        first = items[0].span.line if items else len(self.src.lines) + 1
        self.gap(1, first - 1, 0, state)
        if module.version is not None:
            # The version line goes first, wherever it was.
            self.flush_blank(state)
            self.version(module.version)
            state.started, state.after_item = True, True
        prev = first - 1
        for item in items:
            self.gap(prev + 1, item.span.line - 1, 0, state)
            prev = item.span.end_line
            if isinstance(item, ast.Version):
                continue
            state.blank = state.blank or state.after_item
            self.flush_blank(state)
            self.block(item)
            state.started, state.after_item = True, True
        self.gap(prev + 1, len(self.src.lines), 0, state)
        if self.placed != len(self.src.comments):
            raise FormatError(f"placed {self.placed} of {len(self.src.comments)} comments")
        return self.render()

    def render(self) -> str:
        # Trailing comments of one group that shared a source column share an output
        # column: the source column, moved left as far as all their lines' code moved
        # left (so messy spacing does not leave a gap behind), and right as far as
        # needed to leave two spaces after the longest line.
        need: dict[tuple[object, int], int] = {}
        shift: dict[tuple[object, int], int] = {}
        for row in self.out:
            if row.chain is not None:
                key = (row.group, row.chain.col)
                end = row.indent + len(row.text)
                need[key] = max(need.get(key, 0), end + 2)
                moved = max(0, row.chain.code_end - end)
                shift[key] = min(shift.get(key, moved), moved)
        columns = {key: max(key[1] - shift[key], need[key]) for key in need}
        text: list[str] = []
        for row in self.out:
            if row.kind == "blank":
                text.append("")
                continue
            line = " " * row.indent + row.text
            if row.chain is None:
                text.append(line)
                continue
            col = columns[(row.group, row.chain.col)]
            text.append(line.ljust(col) + row.chain.text)
            text.extend(" " * col + c.text for c in row.chain.chain)
        while text and text[-1] == "":
            text.pop()
        return "".join(line + "\n" for line in text)


def format_text(text: str, file: str = "<spec>") -> tuple[str | None, list]:
    """The canonical layout of `text`, or None and the syntax error."""
    module, diags = parse(text, file)
    if module is None:
        return None, diags
    out = _Formatter(module, text).run()
    _verify(module, out, file)
    return out, diags


def _strip(obj):
    """A tree as plain data, spans dropped, for comparing before and after."""
    if dataclasses.is_dataclass(obj):
        return (type(obj).__name__,) + tuple(
            _strip(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if f.name not in ("span", "comments", "tokens")
        )
    if isinstance(obj, tuple | list):
        return tuple(_strip(x) for x in obj)
    return obj


def _verify(before: ast.Module, text: str, file: str) -> None:
    after, diags = parse(text, file)
    if after is None:
        raise FormatError(f"the formatted {file} does not parse: {diags[0].message}")
    if _strip(before) != _strip(after):
        raise FormatError(f"the formatted {file} parses to a different tree")
    old = [t.rstrip() for _, t in before.comments]
    new = [t for _, t in after.comments]
    if old != new:
        raise FormatError(f"the formatted {file} lost or reordered comments")
