"""The MSL syntax tree: small frozen dataclasses, each with the span it came from."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from msgen.diagnostics import Span

# Every node class is a frozen dataclass whose equality, hash and repr are Node's,
# written once: dataclasses would compile three more functions for each class at every
# start of msgen, half the time it takes to define the tree (about 5 ms of a check).
node = dataclass(frozen=True, eq=False, repr=False)


@node
class Node:
    """A node of the tree: equal to another of its class with equal fields."""

    span: Span

    def _values(self) -> tuple:
        return tuple(getattr(self, f.name) for f in fields(self))

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        values = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self))
        return f"{type(self).__qualname__}({values})"


# Expressions ---------------------------------------------------------------


@node
class Number(Node):
    """A number literal, with its text as written."""

    value: int | float
    text: str


@node
class String(Node):
    """A string literal's text, without the quotes."""

    value: str


@node
class Name(Node):
    """A name: a dim, tensor, op, layer or key."""

    name: str


@node
class Size(Node):
    """`58 GiB`: a number and a unit."""

    number: Number
    unit: str


@node
class BinOp(Node):
    """`left op right`."""

    op: str  # one of + - * / //
    left: Expr
    right: Expr


@node
class Neg(Node):
    """`-operand`."""

    operand: Expr


@node
class Kwarg(Node):
    """`name = value` in a call's arguments."""

    name: Name
    value: Expr


@node
class Call(Node):
    """`func(args, kwargs)`: an op, or a value such as `adamw(...)` or `hccn(...)`."""

    func: Name
    args: tuple[Expr, ...] = ()
    kwargs: tuple[Kwarg, ...] = ()


@node
class List(Node):
    """`[items]`: a shape, a sharding or a list value."""

    items: tuple[Expr, ...] = ()


@node
class Repeat(Node):
    """`repeat decoder(x) layers`."""

    layer: Name
    args: tuple[Expr, ...]
    kwargs: tuple[Kwarg, ...]
    count: Expr


@node
class Every(Node):
    """`every 1000 keep 5`."""

    every: Expr
    keep: Expr


Expr = Number | String | Name | Size | BinOp | Neg | Call | List | Repeat | Every


# Statements ----------------------------------------------------------------


@node
class Annot(Node):
    """`weight @ [1, tp]` (param set) or `@ [dp, 1, tp]` (param None: the output)."""

    param: Name | None
    split: List


@node
class Assign(Node):
    """`target = value annots`: a setting, a dim or an op."""

    target: Name
    value: Expr
    annots: tuple[Annot, ...] = ()


@node
class InputDecl(Node):
    """`input name: shape annots`."""

    name: Name
    shape: List
    annots: tuple[Annot, ...] = ()


@node
class OutputStmt(Node):
    """`output value annots`."""

    value: Expr
    annots: tuple[Annot, ...] = ()


@node
class GroupDecl(Node):
    """`allreduce small = ["*.ln*"] buckets 4` in a fusion block."""

    kind: Name
    name: Name
    value: Expr
    buckets: Expr | None = None


Stmt = Assign | InputDecl | OutputStmt | GroupDecl


@node
class Block(Node):
    """`kind name { stmts }` (`model gpt { ... }`, `mesh { ... }`)."""

    kind: Name
    name: Name | None
    stmts: tuple[Stmt, ...] = ()


@node
class Version(Node):
    """`version 1`."""

    keyword: Name
    number: Number


@node
class Module(Node):
    """A whole spec: the version line and the blocks."""

    version: Version | None
    blocks: tuple[Block, ...] = ()
    comments: tuple[tuple[int, str], ...] = field(default=())  # (line, text), for fmt
    # (line, column, text) of every other token but newlines, from the lexer: for fmt,
    # which finds there the brackets the tree does not record
    tokens: tuple[tuple[int, int, str], ...] = field(default=())
