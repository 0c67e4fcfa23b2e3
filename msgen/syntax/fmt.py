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

import bisect
import dataclasses
from dataclasses import dataclass, field

from msgen.diagnostics import Span
from msgen.syntax import ast, parse

INDENT = 4
# Operator precedence, loosest first; atoms bind tightest.
PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "//": 2}
NEG_PREC = 3
ATOM_PREC = 4


class FormatError(Exception):
    """The formatted text would not mean what the original means (a bug in fmt)."""


# Comments -------------------------------------------------------------------


@dataclass
class _Comment:
    line: int
    col: int  # 0-based column of `#` in the source line
    text: str
    kind: str  # "trailing" (after code), "cont" (continues the one above), "standalone"
    code_end: int  # where the code before a trailing comment ended in the source
    chain: list[_Comment] = field(default_factory=list)  # a head's continuation lines


def _comments(module: ast.Module, lines: list[str]) -> dict[int, _Comment]:
    """Each comment by line, classified; continuation lines are hung on their chain's
    head (a trailing comment), so they move with it."""
    by_line: dict[int, _Comment] = {}
    head_of: dict[int, _Comment] = {}
    for line, raw in module.comments:
        src = lines[line - 1]
        col = len(src) - len(raw)  # a comment runs to the end of its line
        text = raw.rstrip()
        if src[:col].strip():
            comment = _Comment(line, col, text, "trailing", len(src[:col].rstrip()))
            head_of[line] = comment
        else:
            above = by_line.get(line - 1)
            if above is not None and above.kind != "standalone" and above.col == col:
                comment = _Comment(line, col, text, "cont", 0)
                head = head_of[line - 1]
                head.chain.append(comment)
                head_of[line] = head
            else:
                comment = _Comment(line, col, text, "standalone", 0)
        by_line[line] = comment
    return by_line


# Output rows ----------------------------------------------------------------


@dataclass
class _Row:
    """One output line: code (maybe with a trailing comment chain), a comment, or blank."""

    kind: str  # "code", "comment", "blank"
    indent: int = 0
    text: str = ""
    first: int | None = None  # the source lines this row's tokens came from
    last: int | None = None
    cindent: int | None = None  # where comments placed above this row are indented
    chain: _Comment | None = None  # trailing comment (with its continuations)
    group: object = None  # trailing comments align within one group

    def take(self, first: int, last: int) -> None:
        self.first = first if self.first is None else min(self.first, first)
        self.last = last if self.last is None else max(self.last, last)


class _Printer:
    """Prints one statement (or header) into rows, recording for each row the source
    lines it came from so that comments can find their row."""

    def __init__(self, indent: int, src: _Formatter):
        self.rows = [_Row("code", indent, cindent=indent)]
        self.src = src  # finds brackets the tree does not record

    @property
    def row(self) -> _Row:
        return self.rows[-1]

    @property
    def col(self) -> int:
        return self.row.indent + len(self.row.text)

    def put(self, text: str, first: int | None = None, last: int | None = None) -> None:
        self.row.text += text
        if first is not None:
            self.row.take(first, first if last is None else last)

    def node(self, text: str, node: ast.Node) -> None:
        self.put(text, node.span.line, node.span.end_line)

    def newline(self, indent: int, cindent: int | None = None) -> None:
        self.rows.append(_Row("code", indent, cindent=indent if cindent is None else cindent))

    # expressions

    def expr(self, e: ast.Expr | ast.Kwarg, min_prec: int = 0) -> None:
        # Parentheses in the source that the tree dropped (`(a + b)`, redundant or
        # not) can sit on lines the expression does not reach: those lines join the
        # rows where it starts and ends, so nothing is left outside the statement.
        first, last = self.src.extent(e)
        if first < e.span.line:
            self.put("", first)
        prec = _prec(e)
        if prec < min_prec:
            self.put("(")
        if isinstance(e, ast.Number):
            self.node(e.text, e)
        elif isinstance(e, ast.String):
            self.node(f'"{e.value}"', e)
        elif isinstance(e, ast.Name):
            self.node(e.name, e)
        elif isinstance(e, ast.Size):
            self.node(f"{e.number.text} {e.unit}", e)
        elif isinstance(e, ast.BinOp):
            self.expr(e.left, prec)
            self.put(f" {e.op} ")
            self.expr(e.right, prec + 1)  # left-associative: a - (b - c) keeps its parens
        elif isinstance(e, ast.Neg):
            self.put("-", e.span.line)
            self.expr(e.operand, NEG_PREC)
        elif isinstance(e, ast.Kwarg):
            self.node(e.name.name, e.name)
            self.put(" = ")
            self.expr(e.value)
        elif isinstance(e, ast.Call):
            self.node(e.func.name, e.func)
            items = sorted(e.args + e.kwargs, key=_start)
            self.seq("(", items, ")", *self.src.brackets(e.func.span))
        elif isinstance(e, ast.List):
            self.seq("[", e.items, "]", e.span.line, e.span.end_line)
        elif isinstance(e, ast.Repeat):
            self.put("repeat ", e.span.line)
            self.node(e.layer.name, e.layer)
            items = sorted(e.args + e.kwargs, key=_start)
            self.seq("(", items, ")", *self.src.brackets(e.layer.span))
            self.put(" ")
            self.expr(e.count)
        elif isinstance(e, ast.Every):
            self.put("every ", e.span.line)
            self.expr(e.every)
            self.put(" keep ")
            self.expr(e.keep)
        else:  # pragma: no cover - the tree has no other nodes
            raise FormatError(f"cannot print {type(e).__name__}")
        if prec < min_prec:
            self.put(")")
        if last > e.span.end_line:
            self.put("", last)

    def seq(self, open_: str, items, close: str, open_line: int, close_line: int) -> None:
        self.put(open_, open_line)
        # Where each item starts and ends, its parentheses included: a break inside
        # them is a break inside the item, not between items.
        lines = [self.src.extent(item) for item in items]
        if not items or open_line == close_line:
            for i, item in enumerate(items):
                if i:
                    self.put(", ")
                self.expr(item)
            self.put(close, close_line)
            return
        if lines[0][0] > open_line:
            # Hanging: items on their own lines, a comma after each, close alone.
            base = self.row.indent
            inner = base + INDENT
            for i, item in enumerate(items):
                if i == 0 or lines[i][0] > lines[i - 1][1]:
                    if i:
                        self.put(",")
                    self.newline(inner)
                else:
                    self.put(", ")
                self.expr(item)
            self.put(",")
            self.newline(base, cindent=inner)
            # `]` on the last item's line in the source: this row has no source line
            # of its own, so a comment there stays with the item.
            own = close_line > lines[-1][1]
            self.put(close, close_line if own else None)
            return
        # Visual: later lines align with the first item; close after the last one.
        align = self.col
        for i, item in enumerate(items):
            if i:
                if lines[i][0] > lines[i - 1][1]:
                    self.put(",")
                    self.newline(align)
                else:
                    self.put(", ")
            self.expr(item)
        self.put(close, close_line)

    # statements

    def annots(self, annots: tuple[ast.Annot, ...]) -> None:
        for annot in annots:
            self.put(" ")
            if annot.param is not None:
                self.node(annot.param.name, annot.param)
                self.put(" ")
            self.put("@ ", annot.span.line)
            self.expr(annot.split)

    def stmt(self, stmt: ast.Stmt, width: int) -> None:
        if isinstance(stmt, ast.Assign):
            self.node(stmt.target.name.ljust(width), stmt.target)
            self.put(" = ")
            self.expr(stmt.value)
            self.annots(stmt.annots)
        elif isinstance(stmt, ast.GroupDecl):
            self.node(_left(stmt).ljust(width), stmt.kind)
            self.put(" = ")
            self.expr(stmt.value)
            if stmt.buckets is not None:
                self.put(" buckets ")
                self.expr(stmt.buckets)
        elif isinstance(stmt, ast.InputDecl):
            self.put("input ", stmt.span.line)
            self.node(stmt.name.name, stmt.name)
            self.put(" : ")
            self.expr(stmt.shape)
            self.annots(stmt.annots)
        elif isinstance(stmt, ast.OutputStmt):
            self.put("output ", stmt.span.line)
            self.expr(stmt.value)
            self.annots(stmt.annots)
        else:  # pragma: no cover
            raise FormatError(f"cannot print {type(stmt).__name__}")


def _prec(e) -> int:
    if isinstance(e, ast.BinOp):
        return PREC[e.op]
    if isinstance(e, ast.Neg):
        return NEG_PREC
    if isinstance(e, ast.Repeat | ast.Every):
        return 0
    return ATOM_PREC


def _walk(node: ast.Node):
    """A node and all the nodes under it."""
    yield node
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        for child in value if isinstance(value, tuple) else (value,):
            if isinstance(child, ast.Node):
                yield from _walk(child)


def _start(node: ast.Node) -> tuple[int, int]:
    return (node.span.line, node.span.col)


def _left(stmt: ast.Stmt) -> str | None:
    """What goes left of an aligned `=`; None for statements that are not aligned."""
    if isinstance(stmt, ast.Assign):
        return stmt.target.name
    if isinstance(stmt, ast.GroupDecl):
        return f"{stmt.kind.name} {stmt.name.name}"
    return None


# The formatter ---------------------------------------------------------------


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
        self.lines = text.split("\n")
        self.comments = _comments(module, self.lines)
        self.out: list[_Row] = []
        self.placed = 0  # comments written, checked against the total at the end
        self.groups = 0
        self.tokens: list[tuple[int, str]] = []  # (line, text)
        self.starts: list[tuple[int, int]] = []  # (line, column) of each token
        self.match: dict[int, int] = {}
        self.calls: set[int] = set()
        self.scan()

    def new_group(self) -> int:
        self.groups += 1
        return self.groups

    # the brackets the tree does not record

    def scan(self) -> None:
        """Take the lexer's tokens (`self.tokens`, with their `self.starts`), match their
        brackets (`self.match`, both ways) and find the `(` of every call and repeat
        (`self.calls`): every other `(` is a parenthesis the parser dropped."""
        for line, col, text in self.module.tokens:
            self.tokens.append((line, text))
            self.starts.append((line, col))
        stack: list[int] = []
        for i, (_, tok) in enumerate(self.tokens):
            if tok in ("(", "[", "{"):
                stack.append(i)
            elif tok in (")", "]", "}"):
                j = stack.pop()
                self.match[i], self.match[j] = j, i
        for node in _walk(self.module):
            if isinstance(node, ast.Call):
                self.calls.add(self.after(node.func.span))
            elif isinstance(node, ast.Repeat):
                self.calls.add(self.after(node.layer.span))

    def first(self, span: Span) -> int:
        """The index of the first token of a span."""
        return bisect.bisect_left(self.starts, (span.line, span.col))

    def after(self, span: Span) -> int:
        """The index of the first token after a span."""
        return bisect.bisect_left(self.starts, (span.end_line, span.end_col))

    def brackets(self, before: Span) -> tuple[int, int]:
        """The lines of the bracket right after a span (the `(` of `f(...)`, the `{`
        of a block) and of the one that closes it; a backslash continuation can put
        either on a later line."""
        i = self.after(before)
        return self.tokens[i][0], self.tokens[self.match[i]][0]

    def extent(self, node: ast.Node) -> tuple[int, int]:
        """The first and the last line of an expression with the parentheses around
        it, which its span leaves out: `(` right before it and the `)` that closes
        that one right after it, not the brackets of a call."""
        i, j = self.first(node.span), self.after(node.span) - 1
        while i > 0 and self.tokens[i - 1][1] == "(" and i - 1 not in self.calls:
            if self.match[i - 1] != j + 1:
                break
            i, j = i - 1, j + 1
        return self.tokens[i][0], self.tokens[j][0]

    def end(self, stmt: ast.Stmt) -> int:
        """The last line of a statement. Its span ends with its last node, which can
        leave out the `)` of parentheses around that node (`x = (a + b)`): at the top
        level, every `)` that follows closes one of those."""
        j = self.after(stmt.span)
        while j < len(self.tokens) and self.tokens[j][1] == ")":
            j += 1
        return self.tokens[j - 1][0]

    def blank(self, line: int) -> bool:
        return 0 < line <= len(self.lines) and not self.lines[line - 1].strip()

    # placing comments

    def comment_rows(self, head: _Comment, indent: int) -> None:
        for c in [head, *head.chain]:
            self.out.append(_Row("comment", indent, c.text))
            self.placed += 1

    def emit(self, rows: list[_Row], group: int) -> None:
        """Append a unit's rows, giving each the comments of its source lines: the
        last trailing comment of a row stays on it, others move above it, and a
        comment between two of the unit's lines goes above the later one."""
        spans = [(r.first, r.last) for r in rows if r.first is not None]
        above: list[list[_Comment]] = [[] for _ in rows]
        on: list[list[_Comment]] = [[] for _ in rows]
        if spans:
            lo, hi = min(f for f, _ in spans), max(last for _, last in spans)
            heads = [self.comments.get(line) for line in range(lo, hi + 1)]
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
            if self.blank(line):
                state.blank = state.started
                continue
            comment = self.comments.get(line)
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
            src = self.lines[line - 1]
            code = (src[: comment.col] if comment else src).strip()
            state.blank = state.blank or state.after_item
            self.flush_blank(state)
            rows = [_Row("code", indent, code, line, line, cindent=indent)]
            self.emit(rows, self.new_group())
            state.started, state.after_item = True, True
            state.run = None

    def flush_blank(self, state: _State) -> None:
        if state.blank:
            self.out.append(_Row("blank"))
            state.blank = False
            state.run = None

    # units

    def version(self, version: ast.Version) -> None:
        p = _Printer(0, self)
        p.node(version.keyword.name, version.keyword)
        p.put(" ")
        p.node(version.number.text, version.number)
        self.emit(p.rows, self.new_group())

    def block(self, block: ast.Block) -> None:
        header = _Printer(0, self)
        header.node(block.kind.name, block.kind)
        if block.name is not None:
            header.put(" ")
            header.node(block.name.name, block.name)
        open_line, close_line = self.brackets((block.name or block.kind).span)
        stmts = block.stmts
        inside = [self.comments.get(line) for line in range(open_line + 1, close_line)]
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
            p = _Printer(INDENT, self)
            p.stmt(stmt, width)
            self.emit(p.rows, state.run)
            state.started = True
            prev = self.end(stmt)
        self.gap(prev + 1, close_line - 1, INDENT, state)
        # A blank line still pending here would come right before `}`: dropped.
        close = _Row("code", 0, "}", cindent=INDENT)
        if close_line > prev:
            close.take(close_line, close_line)
        self.emit([close], self.new_group())

    def widths(self, block: ast.Block, open_line: int) -> list[int]:
        """Per statement, the width its left side is padded to: the widest in its run."""
        runs: list[list[int]] = [[]]
        prev = open_line
        for i, stmt in enumerate(block.stmts):
            between = range(prev + 1, stmt.span.line)
            if runs[-1] and any(self.blank(line) for line in between):
                runs.append([])
            runs[-1].append(i)
            prev = self.end(stmt)
        widths = [0] * len(block.stmts)
        for run in runs:
            lefts = [_left(block.stmts[i]) for i in run]
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
        first = items[0].span.line if items else len(self.lines) + 1
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
        self.gap(prev + 1, len(self.lines), 0, state)
        if self.placed != len(self.comments):
            raise FormatError(f"placed {self.placed} of {len(self.comments)} comments")
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
