"""Render model.py and train.py from a ModelContext: jinja2, then black's layout
(msgen.emit.layout). jinja2 is imported by msgen.resources.template, when something
is rendered, so that importing msgen (and `msgen check`) stays fast.
"""

from __future__ import annotations

from typing import Any

from msgen.analysis.switches import SPEED_UP_FILE
from msgen.emit import opcode
from msgen.emit.context import ModelContext
from msgen.emit.imports import model_imports
from msgen.emit.layout import format_python
from msgen.emit.ops import EMITTERS
from msgen.emit.ops.cell_choices import CellChoices
from msgen.resources import template

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def _render(name: str, **values: Any) -> str:
    return format_python(template(name).render(**values))


# Helper values that are module-level source several fragments may carry (the scaled
# rope's frequency functions, attention's and mla's): model.py defines each once, in
# the first fragment that carries it; the later ones call that definition.
SHARED_SOURCES = ("rope_frequencies",)


def _helper_cells(ctx: ModelContext, helpers: frozenset[str], mtp_aux: bool) -> list[str]:
    """The helper cells the model's code uses, each from its op's fragment in
    templates/ops/, rendered with the values its emitter gives (`OpEmitter.helper_values`);
    then multi-token prediction's, whose block may thread auxiliary losses."""
    ops = ctx.ops()
    cells, carried = [], set()
    for kind, emitter in EMITTERS.items():
        for helper in emitter.helpers:
            if helper not in helpers:
                continue
            values = emitter.helper_values([op for op in ops if op.kind == kind])
            for key in SHARED_SOURCES:
                if values.get(key) in carried:
                    values[key] = ""  # an earlier fragment defines it
                elif values.get(key):
                    carried.add(values[key])
            cells.append(template(f"ops/{helper}.py.j2").render(**values))
    return cells + ([template("ops/mtp.py.j2").render(aux=mtp_aux)] if "mtp" in helpers else [])


def _shell(ctx: ModelContext, helpers: frozenset[str]) -> list[str]:
    """The module helpers model.py defines for its cells, in order
    (templates/model/shell/<name>.py.j2): the cell that places a network-level primitive
    on a stage, the auxiliary losses' adder, the fused kernels' switch, dropout's seeds."""
    wanted = {
        "apply": "apply" in helpers,
        "aux_losses": "aux_losses" in helpers,
        "fused_kernels": bool(ctx.fused),
        "dropout_seeds": bool(ctx.dropout),
    }
    return [name for name, used in wanted.items() if used]


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
        choices=CellChoices.of(
            "model",
            fusion="ids" if ctx.fusion or ctx.layer_fusion else "none",
            lazy_inline="ascend" if ctx.lazy_inline else "off",
        ),
        shell=_shell(ctx, helpers),
        imports=model_imports(ctx),
        helper_cells=_helper_cells(ctx, helpers, ctx.mtp is not None and code[ctx.mtp.layer].aux),
        dtypes=DTYPES,
    )


def render_train(ctx: ModelContext) -> str:
    return _render("train.py.j2", ctx=ctx, dtypes=DTYPES, speed_up_file=SPEED_UP_FILE)
