"""Evaluate integer and number expressions of the AST against the dims in scope."""

from __future__ import annotations

import math

from msgen.diagnostics import Diagnostic, did_you_mean, error
from msgen.syntax import ast
from msgen.syntax.to_ast import MAX_NUMBER

DIM_LIMIT = 2**40

UNIT_BYTES = {
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
}


# Unknown names whose hint scans every dim for the closest; later ones are past what
# the text output shows of one code (MAX_PER_CODE), and n of them would cost n^2.
HINTED = 20


class DefinedAfter:
    """The names assigned after statement `index` of a block, as a set for `in`:
    one table of each name's last statement, so a block of n dims is checked in
    O(n), not by building a set of the later names per statement."""

    def __init__(self, last: dict[str, int]):
        self.last = last
        self.index = -1

    def __contains__(self, name: str) -> bool:
        return self.last.get(name, -1) > self.index


class Evaluator:
    """Evaluates expressions over `env`; problems go to `diags`, the value is None."""

    def __init__(
        self,
        env: dict[str, int],
        diags: list[Diagnostic],
        later: set[str] | DefinedAfter = frozenset(),
        failed: set[str] = frozenset(),
    ):
        self.env = env
        self.diags = diags
        self.later = later  # names defined further down: "used before definition"
        self.failed = failed  # dims whose own definition was reported: stay quiet
        self.unknown = 0  # unknown names reported so far

    def unknown_hint(self, name: str) -> str:
        """The closest dim, or the dims there are: a scan of them all."""
        return did_you_mean(name, self.env) or (
            f"known dims: {', '.join(self.env)}"
            if self.env
            else "no dims can be used here: write a whole number"
        )

    def number(self, expr: ast.Expr) -> int | float | None:
        """The value of `expr`; one a float cannot hold (inf, or an OverflowError on the
        way) is reported where it arises (MSL006), so every value is finite."""
        try:
            value = self._value(expr)
        except OverflowError:
            value = math.inf
        if value is not None and not abs(value) <= MAX_NUMBER:
            self.diags.append(
                error(
                    "MSL006",
                    "the value is out of range",
                    expr.span,
                    f"numbers and the values computed from them are at most {MAX_NUMBER:.4g}",
                )
            )
            return None
        return value

    def _value(self, expr: ast.Expr) -> int | float | None:
        match expr:
            case ast.Number(value=v):
                return v
            case ast.Size(number=n, unit=u):
                return n.value * UNIT_BYTES[u]
            case ast.Name(name=name):
                if name in self.env:
                    return self.env[name]
                if name in self.failed:
                    return None
                if name in self.later:
                    self.diags.append(
                        error(
                            "MSL111",
                            f"`{name}` is used before it is defined",
                            expr.span,
                            "dims may only use dims defined above them",
                        )
                    )
                else:
                    self.unknown += 1
                    hint = self.unknown_hint(name) if self.unknown <= HINTED else None
                    self.diags.append(error("MSL101", f"unknown dim `{name}`", expr.span, hint))
                return None
            case ast.Neg(operand=o):
                v = self.number(o)
                return None if v is None else -v
            case ast.BinOp(op=op, left=left, right=right):
                a, b = self.number(left), self.number(right)
                if a is None or b is None:
                    return None
                return self._binop(op, a, b, expr)
        self.diags.append(error("MSL108", "expected a number or an integer expression", expr.span))
        return None

    def _binop(self, op, a, b, expr):
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if b == 0:
            self.diags.append(error("MSL107", "division by zero", expr.span))
            return None
        if op == "//":
            return a // b
        if isinstance(a, int) and isinstance(b, int):
            if a % b:
                self.diags.append(
                    error(
                        "MSL107",
                        f"{a} / {b} does not divide exactly",
                        expr.span,
                        "use `//` to round down, or pick dims that divide",
                    )
                )
                return None
            return a // b
        return a / b

    def integer(self, expr: ast.Expr, what: str = "value") -> int | None:
        v = self.number(expr)
        if v is None:
            return None
        if isinstance(v, float):
            if v.is_integer() and isinstance(expr, ast.Size):
                return int(v)
            self.diags.append(error("MSL108", f"{what} must be an integer, got {v}", expr.span))
            return None
        return v

    def dim(self, expr: ast.Expr, what: str = "dim") -> int | None:
        v = self.integer(expr, what)
        if v is None:
            return None
        if not 0 < v < DIM_LIMIT:
            self.diags.append(
                error(
                    "MSL106",
                    f"{what} = {v} is out of range",
                    expr.span,
                    "dims are positive integers below 2^40",
                )
            )
            return None
        return v
