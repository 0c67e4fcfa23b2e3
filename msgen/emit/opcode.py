"""The code of each op in a generated cell: what `__init__` builds, what `construct` calls.

One function per op kind returns a `Snippet`; `cell_code` turns the snippets of
a layer or of the network into lines, adding what every op shares: the
attribute named after the op, selective recompute, and (network ops) the
pipeline stage. Ops needing more than one primitive or owning parameters use
a helper cell defined once in templates/model.py.j2 (`Snippet.helper`). How a
selected op is marked for recompute follows the op library's rule
(`OpDef.selected_drops_output`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from msgen.emit.context import LayerSpec, ModelContext, OpSpec, Strategy
from msgen.ops import OPS


@dataclass(frozen=True)
class Snippet:
    make: str  # expression assigned to self.<op name> in __init__
    call: str  # right-hand side of `<op name> = ...` in construct
    helper: str | None = None  # helper cell of model.py.j2 that `make` instantiates


@dataclass(frozen=True)
class CellCode:
    init: tuple[str, ...]
    construct: tuple[str, ...]
    helpers: frozenset[str]


def strategy(op: OpSpec, role: str) -> Strategy:
    found = op.strategy(role)
    if found is None:
        raise ValueError(f"op {op.name!r} ({op.kind}) has no {role!r} strategy")
    return found


def args(*values: str | float) -> str:
    return ", ".join(v if isinstance(v, str) else repr(v) for v in values)


def _embedding(op: OpSpec, ctx: ModelContext) -> Snippet:
    (table,) = op.params
    vocab, hidden = table.shape
    gather = strategy(op, "gather")
    return Snippet(
        f"Embedding({vocab}, {hidden}, gather={gather})",
        f"self.{op.name}({args(*op.inputs)})",
        "embedding",
    )


def _positions(op: OpSpec, ctx: ModelContext) -> Snippet:
    (table,) = op.params
    seq, hidden = table.shape
    return Snippet(f"Positions({seq}, {hidden})", f"self.{op.name}()", "positions")


def _linear(op: OpSpec, ctx: ModelContext) -> Snippet:
    (x,) = op.inputs
    matmul = strategy(op, "matmul")
    if op.tie is not None:
        return Snippet(
            f"TiedLinear(matmul={matmul})",
            f"self.{op.name}({x}, self.{op.tie}.table)",
            "tied_linear",
        )
    n_in, n_out = op.params[0].shape
    bias = f", bias={strategy(op, 'bias')}" if op.bias else ""
    std = f", std={op.std!r}" if op.std is not None else ""
    return Snippet(
        f"Linear({n_in}, {n_out}, matmul={matmul}{bias}{std})", f"self.{op.name}({x})", "linear"
    )


def _attention(op: OpSpec, ctx: ModelContext) -> Snippet:
    (qkv,) = op.inputs
    flash = ", flash=True" if op.flash else ""
    make = (
        f"Attention(heads={op.heads}, kv_heads={op.kv_heads}, head_dim={op.head_dim}, "
        f"seq={ctx.seq}, causal={op.causal}, rope={op.rope}, p={op.p!r}, "
        f"scores={strategy(op, 'scores')}{flash})"
    )
    return Snippet(make, f"self.{op.name}({qkv})", "attention")


def _layernorm(op: OpSpec, ctx: ModelContext) -> Snippet:
    (x,) = op.inputs
    (hidden,) = op.params[0].shape
    return Snippet(
        f"LayerNorm({hidden}, eps={op.eps!r}, norm={strategy(op, 'norm')})",
        f"self.{op.name}({x})",
        "layernorm",
    )


def _rmsnorm(op: OpSpec, ctx: ModelContext) -> Snippet:
    (x,) = op.inputs
    (hidden,) = op.params[0].shape
    make = f"RMSNorm({hidden}, eps={op.eps!r}, norm={strategy(op, 'norm')})"
    return Snippet(make, f"self.{op.name}({x})", "rmsnorm")


def _gelu(op: OpSpec, ctx: ModelContext) -> Snippet:
    (x,) = op.inputs
    if op.approximate:  # ops.GeLU is the tanh form
        return Snippet(f"ops.GeLU().shard({strategy(op, 'x')})", f"self.{op.name}({x})")
    return Snippet(f"Gelu({strategy(op, 'x')})", f"self.{op.name}({x})", "gelu")


def _silu(op: OpSpec, ctx: ModelContext) -> Snippet:
    (x,) = op.inputs
    return Snippet(f"SiLU().shard({strategy(op, 'x')})", f"self.{op.name}({x})")


def _swiglu(op: OpSpec, ctx: ModelContext) -> Snippet:
    (x,) = op.inputs
    return Snippet(f"SwiGLU({strategy(op, 'x')})", f"self.{op.name}({x})", "swiglu")


def _dropout(op: OpSpec, ctx: ModelContext) -> Snippet:
    (x,) = op.inputs
    # ops.Dropout returns (output, mask); evaluation (set_train(False)) skips it.
    make = f"ops.Dropout({1.0 - op.p!r}).shard({strategy(op, 'x')})"
    return Snippet(make, f"self.{op.name}({x})[0] if self.training else {x}")


def _binary(primitive: str) -> Callable[[OpSpec, ModelContext], Snippet]:
    def snippet(op: OpSpec, ctx: ModelContext) -> Snippet:
        return Snippet(
            f"ops.{primitive}().shard({strategy(op, 'x')})", f"self.{op.name}({args(*op.inputs)})"
        )

    return snippet


def _cross_entropy(op: OpSpec, ctx: ModelContext) -> Snippet:
    logits, tokens = op.inputs
    # The spec names the network input; the target of position i is labels[i].
    labels = "labels" if tokens == ctx.network.input else tokens
    return Snippet(
        f"CrossEntropy({strategy(op, 'logits')})",
        f"self.{op.name}({logits}, {labels})",
        "cross_entropy",
    )


SNIPPETS: dict[str, Callable[[OpSpec, ModelContext], Snippet]] = {
    "embedding": _embedding,
    "positions": _positions,
    "linear": _linear,
    "attention": _attention,
    "layernorm": _layernorm,
    "rmsnorm": _rmsnorm,
    "gelu": _gelu,
    "silu": _silu,
    "swiglu": _swiglu,
    "dropout": _dropout,
    "add": _binary("Add"),
    "mul": _binary("Mul"),
    "cross_entropy": _cross_entropy,
}


def _op_lines(op: OpSpec, ctx: ModelContext, network: bool) -> tuple[list[str], str, set[str]]:
    snip = SNIPPETS[op.kind](op, ctx)
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
