"""The code of a generated cell: what `__init__` builds, what `construct` calls.

Each op's emitter gives its own `Snippet` (msgen/emit/ops, `OpEmitter.code`); here the snippets of a
layer or of the network become lines, with what every op shares: the attribute
named after the op, selective recompute, and (network ops) the pipeline stage.
Ops needing more than one primitive or owning parameters use a helper cell, a
fragment of templates/ops/ (`Snippet.helper`). How a selected op is marked for
recompute follows the op library's rule (`OpDef.selected_drops_output`).

An op with an auxiliary loss (`Snippet.aux`: moe's load-balancing and z-losses)
returns it beside its output; a layer holding one takes the running sum `aux` and
returns it with its own added, and the network adds the sum to its loss, as
mindformers threads `extra_loss` through its layers
(parallel_core/training_graph/transformer/transformer_block.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from msgen.emit import mtp
from msgen.emit.context import LayerSpec, ModelContext, OpSpec
from msgen.emit.ops import EMITTERS
from msgen.ops import OPS


@dataclass(frozen=True)
class CellCode:
    init: tuple[str, ...]
    construct: tuple[str, ...]
    helpers: frozenset[str]
    aux: bool = False  # it adds auxiliary losses to the running sum `aux`


def _op_lines(
    op: OpSpec, ctx: ModelContext, network: bool, taken: frozenset[str] = frozenset()
) -> tuple[list[str], list[str], set[str], bool]:
    """Its `__init__` and `construct` lines, its helper cells, and whether it adds an
    auxiliary loss (`Snippet.aux`)."""
    snip = EMITTERS[op.kind].code(op, ctx)
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
    if snip.aux:
        local = f"{op.name}_aux"
        while local in taken:  # never the name of another op of the cell
            local += "_"
        added = f"aux = self.add_aux(aux, {local})"
        return init, [f"{op.name}, {local} = {snip.call}", added], helpers, True
    return init, [f"{op.name} = {snip.call}"], helpers, False


def _repeat_lines(op: OpSpec, ctx: ModelContext) -> tuple[list[str], list[str], bool]:
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
    aux = layer_code(layer, ctx).aux
    construct = [
        f"{op.name} = {x}",
        f"for cell in self.{layer.name}:",
        f"    {op.name}, aux = cell({op.name}, aux)" if aux else f"    {op.name} = cell({op.name})",
    ]
    return init, construct, aux


def _cell_code(ops: tuple[OpSpec, ...], ctx: ModelContext, network: bool) -> CellCode:
    init: list[str] = []
    construct: list[str] = []
    helpers: set[str] = set()
    adds_aux = False  # an op of its own adds an auxiliary loss
    threads_aux = False  # or a repeated layer does
    for op in ops:
        if op.kind == "repeat":
            op_init, op_construct, op_aux = _repeat_lines(op, ctx)
            threads_aux = threads_aux or op_aux
        else:
            taken = frozenset(other.name for other in ops)
            op_init, op_construct, op_helpers, op_aux = _op_lines(op, ctx, network, taken)
            adds_aux = adds_aux or op_aux
            helpers |= op_helpers
        init.extend(op_init)
        construct.extend(op_construct)
    if adds_aux and not network:
        init.append("self.add_aux = ops.Add()")
    return CellCode(tuple(init), tuple(construct), frozenset(helpers), adds_aux or threads_aux)


def layer_code(layer: LayerSpec, ctx: ModelContext) -> CellCode:
    for op in layer.ops:
        if layer.recompute and op.recompute:
            # MindSpore takes one recompute setting per subtree.
            raise ValueError(
                f"layer {layer.name!r} is recomputed in full; op {op.name!r} cannot be selected too"
            )
    return _cell_code(layer.ops, ctx, network=False)


def network_code(ctx: ModelContext) -> CellCode:
    """The network's cell; with auxiliary losses, their sum starts at zero and is
    added to the loss and recorded for the log (model.py's AuxLosses) where the loss
    is, on the last stage."""
    code = _cell_code(ctx.network.ops, ctx, network=True)
    if ctx.mtp is not None:  # the modules' loss joins the network's (msgen/emit/mtp.py)
        code = CellCode(
            (*code.init, *mtp.init_lines(ctx)),
            (
                *code.construct,
                *mtp.construct_lines(ctx, layer_code(ctx.layer(ctx.mtp.layer), ctx).aux),
            ),
            code.helpers | mtp.helpers(ctx),
            code.aux,
        )
    if not code.aux:
        return code
    out = ctx.network.output
    init = [*code.init, "self.add_aux = AuxLosses()"]
    if ctx.pp > 1:
        last = next(op for op in ctx.network.ops if op.name == out)
        init.append(f"self.add_aux.pipeline_stage = {last.stage}")
        if ctx.chunks > 1:
            init.append(f"self.add_aux.pipeline_segment = {last.segment}")
    construct = (
        "aux = Tensor(0.0, mstype.float32)",
        *code.construct,
        f"{out} = self.add_aux({out}, aux)",
    )
    return CellCode(tuple(init), construct, code.helpers | {"aux_losses"}, True)
