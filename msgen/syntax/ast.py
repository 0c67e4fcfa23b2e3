"""The MSL syntax tree: small frozen dataclasses, each with the span it came from."""

from __future__ import annotations

from dataclasses import dataclass, field

from msgen.diagnostics import Span


@dataclass(frozen=True)
class Node:
    span: Span


# Expressions ---------------------------------------------------------------


@dataclass(frozen=True)
class Number(Node):
    value: int | float
    text: str


@dataclass(frozen=True)
class String(Node):
    value: str


@dataclass(frozen=True)
class Name(Node):
    name: str


@dataclass(frozen=True)
class Size(Node):
    """`58 GiB`: a number and a unit."""

    number: Number
    unit: str


@dataclass(frozen=True)
class BinOp(Node):
    op: str  # one of + - * / //
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Neg(Node):
    operand: Expr


@dataclass(frozen=True)
class Kwarg(Node):
    name: Name
    value: Expr


@dataclass(frozen=True)
class Call(Node):
    func: Name
    args: tuple[Expr, ...] = ()
    kwargs: tuple[Kwarg, ...] = ()


@dataclass(frozen=True)
class List(Node):
    items: tuple[Expr, ...] = ()


@dataclass(frozen=True)
class Repeat(Node):
    """`repeat decoder(x) layers`."""

    layer: Name
    args: tuple[Expr, ...]
    kwargs: tuple[Kwarg, ...]
    count: Expr


@dataclass(frozen=True)
class Every(Node):
    """`every 1000 keep 5`."""

    every: Expr
    keep: Expr


Expr = Number | String | Name | Size | BinOp | Neg | Call | List | Repeat | Every


# Statements ----------------------------------------------------------------


@dataclass(frozen=True)
class Annot(Node):
    """`weight @ [1, tp]` (param set) or `@ [dp, 1, tp]` (param None: the output)."""

    param: Name | None
    split: List


@dataclass(frozen=True)
class Assign(Node):
    target: Name
    value: Expr
    annots: tuple[Annot, ...] = ()


@dataclass(frozen=True)
class InputDecl(Node):
    name: Name
    shape: List
    annots: tuple[Annot, ...] = ()


@dataclass(frozen=True)
class OutputStmt(Node):
    value: Expr
    annots: tuple[Annot, ...] = ()


@dataclass(frozen=True)
class GroupDecl(Node):
    """`allreduce small = ["*.ln*"] buckets 4` in a fusion block."""

    kind: Name
    name: Name
    value: Expr
    buckets: Expr | None = None


Stmt = Assign | InputDecl | OutputStmt | GroupDecl


@dataclass(frozen=True)
class Block(Node):
    kind: Name
    name: Name | None
    stmts: tuple[Stmt, ...] = ()


@dataclass(frozen=True)
class Version(Node):
    keyword: Name
    number: Number


@dataclass(frozen=True)
class Module(Node):
    version: Version | None
    blocks: tuple[Block, ...] = ()
    comments: tuple[tuple[int, str], ...] = field(default=())  # (line, text), for fmt
    # (line, column, text) of every other token but newlines, from the lexer: for fmt,
    # which finds there the brackets the tree does not record
    tokens: tuple[tuple[int, int, str], ...] = field(default=())
