"""Render model.py and train.py from a ModelContext: jinja2, then black's layout
(msgen.emit.layout). jinja2 is imported by msgen.resources.template, when something
is rendered, so that importing msgen (and `msgen check`) stays fast.
"""

from __future__ import annotations

from typing import Any

from msgen.emit import opcode
from msgen.emit.context import ModelContext
from msgen.emit.imports import model_imports
from msgen.emit.layout import format_python
from msgen.ops import OPS
from msgen.resources import template

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def _render(name: str, **values: Any) -> str:
    return format_python(template(name).render(**values))


def render_model(ctx: ModelContext) -> str:
    code: dict[str | None, opcode.CellCode] = {
        layer.name: opcode.layer_code(layer, ctx) for layer in ctx.layers
    }
    code[None] = opcode.network_code(ctx)
    helpers = frozenset().union(*(c.helpers for c in code.values()))
    flash = any(op.setting("flash") for layer in ctx.layers for op in layer.ops) or any(
        op.setting("flash") for op in ctx.network.ops
    )
    return _render(
        "model.py.j2",
        ctx=ctx,
        code=code,
        helpers=helpers,
        imports=model_imports(ctx),
        flash=flash,
        dtypes=DTYPES,
        op_helpers=tuple(h for op in OPS.values() for h in op.helpers),
    )


def render_train(ctx: ModelContext) -> str:
    return _render("train.py.j2", ctx=ctx, dtypes=DTYPES)
