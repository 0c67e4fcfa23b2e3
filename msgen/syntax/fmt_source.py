"""What `msgen fmt` reads from a spec's text besides its tree: each comment, where it
sits and what it continues, and the tokens' brackets (the parentheses the parser
dropped, the lines a bracket opens and closes on), which the tree does not record."""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass, field

from msgen.diagnostics import Span
from msgen.syntax import ast


@dataclass
class Comment:
    line: int
    col: int  # 0-based column of `#` in the source line
    text: str
    kind: str  # "trailing" (after code), "cont" (continues the one above), "standalone"
    code_end: int  # where the code before a trailing comment ended in the source
    chain: list[Comment] = field(default_factory=list)  # a head's continuation lines


def comments(module: ast.Module, lines: list[str]) -> dict[int, Comment]:
    """Each comment by line, classified; continuation lines are hung on their chain's
    head (a trailing comment), so they move with it."""
    by_line: dict[int, Comment] = {}
    head_of: dict[int, Comment] = {}
    for line, raw in module.comments:
        src = lines[line - 1]
        col = len(src) - len(raw)  # a comment runs to the end of its line
        text = raw.rstrip()
        if src[:col].strip():
            comment = Comment(line, col, text, "trailing", len(src[:col].rstrip()))
            head_of[line] = comment
        else:
            above = by_line.get(line - 1)
            if above is not None and above.kind != "standalone" and above.col == col:
                comment = Comment(line, col, text, "cont", 0)
                head = head_of[line - 1]
                head.chain.append(comment)
                head_of[line] = head
            else:
                comment = Comment(line, col, text, "standalone", 0)
        by_line[line] = comment
    return by_line


class Source:
    """A parsed spec's text: its lines, its comments by line, and its tokens with their
    brackets matched."""

    def __init__(self, module: ast.Module, text: str):
        self.module = module
        self.lines = text.split("\n")
        self.comments = comments(module, self.lines)
        self.tokens: list[tuple[int, str]] = []  # (line, text)
        self.starts: list[tuple[int, int]] = []  # (line, column) of each token
        self.match: dict[int, int] = {}
        self.calls: set[int] = set()
        self.scan()

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


def _walk(node: ast.Node):
    """A node and all the nodes under it."""
    yield node
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        for child in value if isinstance(value, tuple) else (value,):
            if isinstance(child, ast.Node):
                yield from _walk(child)
