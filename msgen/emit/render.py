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


def _helper_cells(ctx: ModelContext, helpers: frozenset[str], mtp_aux: bool) -> list[str]:
    """The helper cells the model's code uses, each from its op's fragment in
    templates/ops/, rendered with the values its op gives (`OpDef.helper_values`);
    then multi-token prediction's, whose block may thread auxiliary losses."""
    ops = ctx.ops()
    return [
        template(f"ops/{helper}.py.j2").render(
            **opdef.helper_values([op for op in ops if op.kind == kind])
        )
        for kind, opdef in OPS.items()
        for helper in opdef.helpers
        if helper in helpers
    ] + ([template("ops/mtp.py.j2").render(aux=mtp_aux)] if "mtp" in helpers else [])


def render_model(ctx: ModelContext) -> str:
    code: dict[str | None, opcode.CellCode] = {
        layer.name: opcode.layer_code(layer, ctx) for layer in ctx.layers
    }
    code[None] = opcode.network_code(ctx)
    helpers = frozenset().union(*(c.helpers for c in code.values()))
    return _render(
        "model.py.j2",
        ctx=ctx,
        code=code,
        helpers=helpers,
        imports=model_imports(ctx),
        helper_cells=_helper_cells(ctx, helpers, ctx.mtp is not None and code[ctx.mtp.layer].aux),
        dtypes=DTYPES,
    )


def render_train(ctx: ModelContext) -> str:
    return _render("train.py.j2", ctx=ctx, dtypes=DTYPES)
