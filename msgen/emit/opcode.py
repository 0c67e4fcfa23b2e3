"""The code of a generated cell: what `__init__` builds, what `construct` calls.

Each op's module gives its own `Snippet` (`OpDef.code`); here the snippets of a
layer or of the network become lines, with what every op shares: the attribute
named after the op, selective recompute, and (network ops) the pipeline stage.
Ops needing more than one primitive or owning parameters use a helper cell, a
fragment of templates/ops/ (`Snippet.helper`). How a selected op is marked for
recompute follows the op library's rule (`OpDef.selected_drops_output`).
"""

from __future__ import annotations

from dataclasses import dataclass

from msgen.emit.context import LayerSpec, ModelContext, OpSpec
from msgen.ops import OPS


@dataclass(frozen=True)
class CellCode:
    init: tuple[str, ...]
    construct: tuple[str, ...]
    helpers: frozenset[str]


def _op_lines(op: OpSpec, ctx: ModelContext, network: bool) -> tuple[list[str], str, set[str]]:
    snip = OPS[op.kind].code(op, ctx)
    helpers = {snip.helper} if snip.helper else set()
    make = snip.make
    init: list[str] = []
    if snip.helper is None:
        if op.recompute:
            if not OPS[op.kind].selected_drops_output:
                raise ValueError(f"op {op.name!r} ({op.kind}) keeps its output: it needs a cell")
            make += ".recompute()"  # a recomputed primitive does not keep its output either
        if network and ctx.pp > 1:  # only cells carry a pipeline stage
            make = f"Apply({make})"
            helpers.add("apply")
    init.append(f"self.{op.name} = {make}")
    if snip.helper is not None and op.recompute:
        # What a selected op keeps is the op library's rule (OpDef.selected_drops_output);
        # a cell keeps its outputs unless asked (mindspore/nn/cell.py).
        drops = OPS[op.kind].selected_drops_output
        init.append(f"self.{op.name}.recompute({'output_recompute=True' if drops else ''})")
    if network and ctx.pp > 1:
        init.append(f"self.{op.name}.pipeline_stage = {op.stage}")
        if ctx.chunks > 1:
            init.append(f"self.{op.name}.pipeline_segment = {op.segment}")
    return init, f"{op.name} = {snip.call}", helpers


def _repeat_lines(op: OpSpec, ctx: ModelContext) -> tuple[list[str], list[str]]:
    assert op.layer is not None
    layer = ctx.layer(op.layer)
    (x,) = op.inputs
    cells = f"self.{layer.name}"
    init = [f"{cells} = nn.CellList([{layer.class_name}() for _ in range({op.count})])"]
    if ctx.pp > 1 and ctx.chunks > 1:
        init += [
            "# (first copy, end copy, stage, segment): the copies of each virtual stage",
            f"for first, end, stage, segment in {op.placement}:",
            "    for i in range(first, end):",
            f"        {cells}[i].pipeline_stage = stage",
            f"        {cells}[i].pipeline_segment = segment",
        ]
    elif ctx.pp > 1:
        runs = tuple((first, end, stage) for first, end, stage, _ in op.placement)
        init += [
            "# (first copy, end copy, stage): the copies each pipeline stage runs",
            f"for first, end, stage in {runs}:",
            "    for i in range(first, end):",
            f"        {cells}[i].pipeline_stage = stage",
        ]
    if layer.recompute:
        init += [f"for cell in {cells}:", "    cell.recompute()"]
    construct = [
        f"{op.name} = {x}",
        f"for cell in self.{layer.name}:",
        f"    {op.name} = cell({op.name})",
    ]
    return init, construct


def _cell_code(ops: tuple[OpSpec, ...], ctx: ModelContext, network: bool) -> CellCode:
    init: list[str] = []
    construct: list[str] = []
    helpers: set[str] = set()
    for op in ops:
        if op.kind == "repeat":
            op_init, op_construct = _repeat_lines(op, ctx)
        else:
            op_init, line, op_helpers = _op_lines(op, ctx, network)
            op_construct = [line]
            helpers |= op_helpers
        init.extend(op_init)
        construct.extend(op_construct)
    return CellCode(tuple(init), tuple(construct), frozenset(helpers))


def layer_code(layer: LayerSpec, ctx: ModelContext) -> CellCode:
    for op in layer.ops:
        if layer.recompute and op.recompute:
            # MindSpore takes one recompute setting per subtree.
            raise ValueError(
                f"layer {layer.name!r} is recomputed in full; op {op.name!r} cannot be selected too"
            )
    return _cell_code(layer.ops, ctx, network=False)


def network_code(ctx: ModelContext) -> CellCode:
    return _cell_code(ctx.network.ops, ctx, network=True)
