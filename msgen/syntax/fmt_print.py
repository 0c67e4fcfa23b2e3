"""How `msgen fmt` prints one statement or block header: into output rows, each
recording the source lines its tokens came from, so that the comments of those lines
find their row (the layout rules: msgen/syntax/fmt.py)."""

from __future__ import annotations

from dataclasses import dataclass

from msgen.syntax import ast
from msgen.syntax.fmt_source import Comment, Source

INDENT = 4
# Operator precedence, loosest first; atoms bind tightest.
PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "//": 2}
NEG_PREC = 3
ATOM_PREC = 4


class FormatError(Exception):
    """The formatted text would not mean what the original means (a bug in fmt)."""


@dataclass
class Row:
    """One output line: code (maybe with a trailing comment chain), a comment, or blank."""

    kind: str  # "code", "comment", "blank"
    indent: int = 0
    text: str = ""
    first: int | None = None  # the source lines this row's tokens came from
    last: int | None = None
    cindent: int | None = None  # where comments placed above this row are indented
    chain: Comment | None = None  # trailing comment (with its continuations)
    group: object = None  # trailing comments align within one group

    def take(self, first: int, last: int) -> None:
        self.first = first if self.first is None else min(self.first, first)
        self.last = last if self.last is None else max(self.last, last)


class Printer:
    """Prints one statement (or header) into rows, recording for each row the source
    lines it came from so that comments can find their row."""

    def __init__(self, indent: int, src: Source):
        self.rows = [Row("code", indent, cindent=indent)]
        self.src = src  # finds brackets the tree does not record

    @property
    def row(self) -> Row:
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
        self.rows.append(Row("code", indent, cindent=indent if cindent is None else cindent))

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
            self.node(left_side(stmt).ljust(width), stmt.kind)
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


def _start(node: ast.Node) -> tuple[int, int]:
    return (node.span.line, node.span.col)


def left_side(stmt: ast.Stmt) -> str | None:
    """What goes left of an aligned `=`; None for statements that are not aligned."""
    if isinstance(stmt, ast.Assign):
        return stmt.target.name
    if isinstance(stmt, ast.GroupDecl):
        return f"{stmt.kind.name} {stmt.name.name}"
    return None
