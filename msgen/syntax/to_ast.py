"""The parse tree to the AST of `msgen.syntax.ast`: each rule's node, with its span,
and number literals read (one a float cannot hold refused, MSL006)."""

from __future__ import annotations

import math
import sys

from lark import Token, Tree

from msgen.diagnostics import Span
from msgen.syntax import ast

# The largest number a literal may write: what a float can hold.
MAX_NUMBER = sys.float_info.max


class Rejected(Exception):
    """A token the parser must not go on with (too deep, a number too large)."""

    def __init__(self, diagnostic_args: tuple):
        super().__init__(diagnostic_args[1])
        self.args_ = diagnostic_args


def _span(file: str, meta) -> Span:
    return Span(
        file=file, line=meta.line, col=meta.column, end_line=meta.end_line, end_col=meta.end_column
    )


def token_span(file: str, tok: Token) -> Span:
    return Span(
        file=file, line=tok.line, col=tok.column, end_line=tok.end_line, end_col=tok.end_column
    )


def _number(tok: Token) -> int | float:
    """A number literal's value; one a float cannot hold is refused (MSL006)."""
    text = str(tok)
    value = float(text)
    if not math.isfinite(value) or value > MAX_NUMBER:
        shown = text if len(text) <= 24 else f"{text[:12]}...{text[-8:]}"
        raise Rejected(
            (
                "MSL006",
                f"number {shown} is too large",
                tok,
                f"numbers are at most {MAX_NUMBER:.4g}",
            )
        )
    # Leading zeros do not count against Python's int_max_str_digits (4,300); the
    # check above leaves at most 309 other digits.
    return int(text.lstrip("0") or "0") if text.isdigit() else value


class ToAst:
    """The parse tree to the AST, bottom up: a rule's method gets the rule's position
    (meta) and its children, already converted. A plain walk, as lark's Transformer
    wraps each call of a method anew (about a millisecond of a spec's parse)."""

    def __init__(self, file: str):
        self.file = file

    def transform(self, tree: Tree):
        children = [self.transform(c) if isinstance(c, Tree) else c for c in tree.children]
        return getattr(self, tree.data)(tree.meta, children)

    def _s(self, meta) -> Span:
        return _span(self.file, meta)

    def _name(self, tok: Token) -> ast.Name:
        return ast.Name(token_span(self.file, tok), str(tok))

    # atoms
    def number(self, meta, children):
        (tok,) = children
        return ast.Number(self._s(meta), _number(tok), str(tok))

    def size(self, meta, children):
        num, unit = children
        number = ast.Number(token_span(self.file, num), _number(num), str(num))
        return ast.Size(self._s(meta), number, str(unit))

    def string(self, meta, children):
        (tok,) = children
        return ast.String(self._s(meta), str(tok)[1:-1])

    def name(self, meta, children):
        return self._name(children[0])

    def _binop(op):  # noqa: N805 - a factory used while building the class
        def build(self, meta, children):
            left, _, right = children
            return ast.BinOp(self._s(meta), op, left, right)

        return build

    add = _binop("+")
    sub = _binop("-")
    mul = _binop("*")
    div = _binop("/")
    floordiv = _binop("//")

    def neg(self, meta, children):
        return ast.Neg(self._s(meta), children[1])

    def atom(self, meta, children):  # parenthesised expression
        return children[1]

    def args(self, meta, children):
        return [c for c in children if not isinstance(c, Token)]

    def kwarg(self, meta, children):
        name, _, value = children
        return ast.Kwarg(self._s(meta), self._name(name), value)

    def _split_args(self, items):
        args = tuple(a for a in items if not isinstance(a, ast.Kwarg))
        kwargs = tuple(a for a in items if isinstance(a, ast.Kwarg))
        return args, kwargs

    def call(self, meta, children):
        func = self._name(children[0])
        items = next((c for c in children if isinstance(c, list)), [])
        args, kwargs = self._split_args(items)
        return ast.Call(self._s(meta), func, args, kwargs)

    def list(self, meta, children):
        items = tuple(c for c in children if not isinstance(c, Token))
        return ast.List(self._s(meta), items)

    def repeat(self, meta, children):
        layer = self._name(children[1])
        items = next((c for c in children if isinstance(c, list)), [])
        args, kwargs = self._split_args(items)
        return ast.Repeat(self._s(meta), layer, args, kwargs, children[-1])

    def every(self, meta, children):
        return ast.Every(self._s(meta), children[1], children[3])

    # statements
    # A statement's span runs from its first token to its last node, so it
    # never takes in the newline (or comment) that ends it.
    def annot(self, meta, children):
        param = self._name(children[0]) if len(children) == 3 else None
        return ast.Annot(self._s(meta), param, children[-1])

    def assign(self, meta, children):
        target, _, value, *annots = children
        target = self._name(target)
        span = target.span.to((annots or [value])[-1].span)
        return ast.Assign(span, target, value, tuple(annots))

    def input_decl(self, meta, children):
        kw, name, _, shape, *annots = children
        span = token_span(self.file, kw).to((annots or [shape])[-1].span)
        return ast.InputDecl(span, self._name(name), shape, tuple(annots))

    def output_stmt(self, meta, children):
        kw, value, *annots = children
        span = token_span(self.file, kw).to((annots or [value])[-1].span)
        return ast.OutputStmt(span, value, tuple(annots))

    def buckets(self, meta, children):
        return children[1]

    def group_decl(self, meta, children):
        kind, name, _, value, *rest = children
        buckets = rest[0] if rest else None
        kind = self._name(kind)
        span = kind.span.to((buckets or value).span)
        return ast.GroupDecl(span, kind, self._name(name), value, buckets)

    def block(self, meta, children):
        names = [c for c in children if isinstance(c, Token) and c.type == "NAME"]
        stmts = tuple(c for c in children if not isinstance(c, Token))
        kind = self._name(names[0])
        name = self._name(names[1]) if len(names) > 1 else None
        close = next(c for c in children if isinstance(c, Token) and c.type == "RBRACE")
        return ast.Block(kind.span.to(token_span(self.file, close)), kind, name, stmts)

    def version(self, meta, children):
        kw, num = children
        number = ast.Number(token_span(self.file, num), _number(num), str(num))
        keyword = self._name(kw)
        return ast.Version(keyword.span.to(number.span), keyword, number)

    def start(self, meta, children):
        version = next((c for c in children if isinstance(c, ast.Version)), None)
        blocks = tuple(c for c in children if isinstance(c, ast.Block))
        span = Span(file=self.file, line=1, col=1, end_line=1, end_col=1)
        if not meta.empty:
            span = self._s(meta)
        return ast.Module(span, version, blocks)
