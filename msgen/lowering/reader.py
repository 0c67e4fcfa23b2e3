"""What every part of lowering shares: the spec being lowered, its diagnostics,
and the readers of keyed statements and simple values."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

from msgen.diagnostics import Diagnostic, Span, did_you_mean, error
from msgen.ir import models as ir
from msgen.ir.schema import (
    KEYS,
    Dtype,
)
from msgen.lowering.evaluate import Evaluator
from msgen.syntax import ast

DTYPES = tuple(Dtype)


class Reader:
    """The state of one spec's lowering and the value readers."""

    def __init__(self, module: ast.Module, file: str, base_dir: Path):
        self.module = module
        self.file = file
        self.base_dir = base_dir
        self.diags: list[Diagnostic] = []
        self.sources: list[bytes] = []  # files the spec reads: part of its hash
        self.failed_dims: set[str] = set()  # model dims already reported as invalid

    def err(self, code, message, span, hint=None):
        self.diags.append(error(code, message, span, hint))

    def keyed(self, block: ast.Block, kind: str) -> dict[str, ast.Assign]:
        """A block's `key = value` statements by key, reporting unknown, duplicate
        and missing keys and statements that do not belong in such a block."""
        known = KEYS[kind]
        out: dict[str, ast.Assign] = {}
        for stmt in block.stmts:
            if not isinstance(stmt, ast.Assign):
                self.err("MSL104", f"this statement does not belong in a `{kind}` block", stmt.span)
                continue
            key = stmt.target.name
            if key not in known:
                hint = did_you_mean(key, known) or f"{kind} keys: {', '.join(known)}"
                self.err("MSL104", f"unknown key `{key}` in `{kind}`", stmt.target.span, hint)
            elif key in out:
                self.err(
                    "MSL102",
                    f"`{key}` is set twice in `{kind}`",
                    stmt.target.span,
                    f"first set on line {out[key].span.line}",
                )
            else:
                out[key] = stmt
        for key, required in known.items():
            if required and key not in out:
                self.err(
                    "MSL105",
                    f"`{kind}` needs `{key}`",
                    block.kind.span,
                    f"add `{key} = ...` to the `{kind}` block",
                )
        return out

    def name_value(self, stmt: ast.Assign, choices=None) -> str | None:
        v = stmt.value
        if not isinstance(v, ast.Name):
            self.err(
                "MSL108",
                f"`{stmt.target.name}` takes a name",
                v.span,
                f"one of: {', '.join(choices)}" if choices else None,
            )
            return None
        if choices and v.name not in choices:
            code = "MSL508" if set(choices) <= set(DTYPES) | {"none"} else "MSL108"
            self.err(
                code,
                f"`{v.name}` is not a valid `{stmt.target.name}`",
                v.span,
                did_you_mean(v.name, choices) or f"one of: {', '.join(choices)}",
            )
            return None
        return v.name

    def string_value(self, expr: ast.Expr, what: str) -> str | None:
        if isinstance(expr, ast.String):
            return expr.value
        self.err("MSL108", f"{what} must be a string in double quotes", expr.span)
        return None

    def path_value(self, expr: ast.Expr, what: str) -> str | None:
        """A string naming a file: never empty (`mindrecord("")` is not "no data")."""
        value = self.string_value(expr, what)
        if value == "":
            self.err("MSL108", f"{what} is empty", expr.span, "no data is written `data = none`")
            return None
        return value

    def call(self, expr: ast.Expr, what: str, ev: Evaluator) -> ir.Call | None:
        if isinstance(expr, ast.Name):
            return ir.Call.model_construct(span=expr.span, name=expr.name)
        if not isinstance(expr, ast.Call) or expr.args:
            self.err("MSL108", f"{what} is written `name(key = value, ...)`", expr.span)
            return None
        args, spans = {}, {}
        for kw in expr.kwargs:
            if kw.name.name in spans:  # as an op's (MSL115): never the last one winning
                self.err("MSL115", f"`{kw.name.name}` is given twice", kw.name.span)
                return None
            spans[kw.name.name] = kw.span
            value = self.scalar(kw.value, ev)
            if value is not None:
                args[kw.name.name] = value
        spans = {k: v for k, v in spans.items() if k in args}
        return ir.Call.model_construct(
            span=expr.span, name=expr.func.name, args=args, arg_spans=spans
        )

    def scalar(self, expr: ast.Expr, ev: Evaluator):
        """A number, a bool (`true`/`false`), a name, or a string."""
        if isinstance(expr, ast.Name) and expr.name in ("true", "false"):
            return expr.name == "true"
        if isinstance(expr, ast.Name) and expr.name not in ev.env:
            return expr.name
        if isinstance(expr, ast.String):
            return expr.value
        return ev.number(expr)

    def spans_of(self, stmts: dict[str, ast.Assign]) -> dict[str, Span]:
        return {k: s.span for k, s in stmts.items()}


def names_in(node) -> Iterator[str]:
    """Every name a syntax subtree mentions, definitions included."""
    if isinstance(node, ast.Name):
        yield node.name
    elif isinstance(node, (tuple, list)):
        for item in node:
            yield from names_in(item)
    elif dataclasses.is_dataclass(node):
        for f in dataclasses.fields(node):
            yield from names_in(getattr(node, f.name))
