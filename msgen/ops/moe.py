"""`moe(x, experts, top_k, ffn, ...)`: a mixture-of-experts feed-forward block.

x [batch, seq, hidden] -> [batch, seq, hidden]. A router [hidden, experts] scores
each token in fp32; each token goes to its `top_k` experts, each expert a gated
(swiglu) or plain (gelu) feed-forward of width `ffn`, and comes back as the sum of
their outputs weighted by the router's probabilities; `shared_ffn` > 0 adds an
always-on expert of that width (the shared experts, fused). The choices follow
Megatron-LM (megatron/core/transformer/moe/router.py, moe_utils.py:
`topk_softmax_with_capacity`, `switch_load_balancing_loss_func`, `z_loss_func`)
and mindformers 2.0.0 (parallel_core/transformer_config.py); docs/language.md
names each.

Expert weights are stacked [experts, ...] and split over `ep` on that dim (each
expert-parallel rank holds experts / ep of them); tokens go to and come back from
their experts' ranks by an AllToAll over `ep` (dispatch and combine, forward and
backward). With a capacity the experts' ffn dim is split over `tp` (expert tensor
parallelism = tp, Megatron's default). Dropless the generated cell is a permuting
dispatcher (Megatron-LM's moe_utils.py permute / unpermute, mindformers 2.0.0's
MoEAlltoAllTokenDispatcher), under semi-auto one Morph region laid as mindformers'
FFNGroupedGEMM lays it (transformer/moe/ffn.py): every device of the stage, tp ranks
included, takes its own tokens, and each expert is whole over tp; the memory, work
and collectives here count it so (`expert_ffn_axes`, `Layout.within`).

With a capacity the cell dispatches GShard's way (Lepikhin et al. 2020): per
data-parallel group, a 0/1 dispatch tensor gathers each expert's slots and the
dispatch tensor times the router weights combines them, both by BatchMatMul
(`transpose_a` for the combine), the queue positions by CumSum and the most probable
copies by TopK, as MindSpore 2.10 defines them (ops/auto_generate/gen_ops_prim.py,
ops/operations/array_ops.py `TopK`); all run on the CPU.
"""

from __future__ import annotations

from math import prod

from msgen.ops import moe_costs as costs
from msgen.ops import moe_routing as routing
from msgen.ops.base import (
    Arg,
    Collective,
    Layout,
    OpDef,
    OpError,
    Param,
    declared,
    factors,
    lead,
    out_declared,
    partial_sum,
    replace_last,
)
from msgen.ops.linear import without
from msgen.ops.moe_geometry import MoeGeometry
from msgen.ops.moe_rows import effective, expert_split, named, split_error

# The stacked experts' and shared experts' matrices, per activation, and the dim
# of each split over tp ("in": the ffn dim is the input, row parallel).
EXPERT = {"swiglu": ("gate", "up", "down"), "gelu": ("up", "down")}
SHARED = {
    "swiglu": ("shared_gate", "shared_up", "shared_down"),
    "gelu": ("shared_up", "shared_down"),
}

# The matrices every rank holds whole, and why.
WHOLE = {
    "router": "every rank routes its tokens over all experts",
    "shared_sigmoid": "its one output column scales each token's shared experts",
}


class Moe(OpDef):
    name = "moe"
    args = (
        Arg("x", "tensor"),
        Arg("experts", "int"),
        Arg("top_k", "int"),
        Arg("ffn", "int"),
        Arg("shared_ffn", "int", 0),
        Arg("shared_sigmoid", "bool", False),
        Arg("activation", "name", "swiglu", choices=("swiglu", "gelu")),
        *routing.ARGS,
        Arg("capacity", "float", None, within="(0, inf)"),
        Arg("drop", "name", "probs", choices=("probs", "position")),
        Arg("aux_loss", "float", 0.0, within="[0, inf)"),
        Arg("z_loss", "float", 0.0, within="[0, inf)"),
        Arg("imbalance", "float", 1.0, within="[1, inf)"),
    )
    params = (
        "router",
        "gate",
        "up",
        "down",
        "shared_gate",
        "shared_up",
        "shared_down",
        "shared_sigmoid",
    )
    composite = True
    imports = (
        "import math",
        "from mindspore import Layout, Parameter, Tensor, nn, ops",
        "from mindspore.common import dtype as mstype",
    )
    # Dropless, the permuting dispatcher: GroupedMatmul on Ascend, where the device
    # target picks it (templates/ops/moe_permute.py.j2 MoE.grouped), the ep group's
    # exchanges and, under semi-auto, the Morph region's layouts.
    setting_imports = {
        "permute": (
            "import hashlib",
            "from functools import cache",
            "import mindspore as ms",
            "from mindspore.communication import GlobalComm, create_group, get_rank",
            "from mindspore.ops.auto_generate import GroupedMatmul",
        )
    }
    inits = {p: "normal" for p in params}
    decays = frozenset(params)  # Megatron-LM decays every matrix, the router too
    expert_params = frozenset(("gate", "up", "down"))

    def strategies(self, node, layout, ctx):
        """The router's and each shared expert's MatMul: the tokens [tokens, hidden]
        (the input's leading dims folded, as `linear` folds them) times the matrix as
        the layout splits it, the router whole, the shared gate and up column parallel
        (their ffn dim over tp), the shared down row parallel; the tokens' reduction
        dim split as the matrix's input dim (the column-parallel activation arrives so).
        With a capacity, the experts' batched matmuls over [experts, groups * slots,
        hidden] times [experts, hidden, ffn], as tensor maps of Layouts over the
        stage's devices [dp / ep, ep, tp] (`devices`, Megatron-LM's order): experts over
        ep, slots over the dp / ep ranks of an ep group (the redistribution from the
        groups' dp split, the dispatch AllToAll inside the ep group: AutoParallel
        enables it, parallel/auto_parallel.py `_enable_alltoall`), ffn over tp. A tuple
        strategy could not: its device matrix follows the tensor dims (matmul_info.cc
        GetCommonShape), ep outermost; BatchMatMul takes Layouts
        (MatMul::CheckInputLayout). Dropless, the Morph region lays its own over the
        same devices (templates/ops/moe_permute.py.j2 `region`): no expert roles."""
        rows = lead(layout.inputs[0], ctx)
        matrices = ((p.name, factors(p.split, ctx)) for p in layout.params if len(p.shape) == 2)
        matmuls = tuple((name, ((rows, w[0]), w)) for name, w in matrices)
        if node.args.get("capacity") is None:
            return matmuls
        gate, down = (named(expert_split(node, ctx, m)) for m in ("gate", "down"))
        slots = (gate[0], "edp", "None")
        return matmuls + (
            ("inner", (slots, gate)),
            ("outer", (slots[:2] + (gate[2],), down)),
        )

    def dropless(self, node) -> bool:
        """No capacity: every routed copy computed, by the permuting dispatcher (under
        semi-auto a Morph region), whose ep exchanges hand their counts to the host."""
        return node.args.get("capacity") is None

    def buffers(self, node) -> dict[str, tuple[int, ...]]:
        return routing.buffers(node)

    def active_params(self, node, params):
        """The router, the shared experts, and top_k of the experts (the published
        active counts of Mixtral-8x7B and Qwen3-30B-A3B count these)."""
        e, k = node.args["experts"], node.args["top_k"]
        stacked = {"gate", "up", "down"}
        return sum(prod(p.shape) * k // e if p.name in stacked else prod(p.shape) for p in params)

    def matrices(self, node) -> tuple[tuple[str, ...], tuple[str, ...]]:
        act = self.arg(node, "activation")
        shared = SHARED[act] if self.arg(node, "shared_ffn") else ()
        return EXPERT[act], shared

    def shape(self, node, inputs, ctx):
        (x,) = inputs
        if len(x) < 2:
            raise OpError("MSL116", f"moe needs [..., tokens, hidden], got {list(x)}", "x")
        e, k = node.args["experts"], node.args["top_k"]
        if e < 1 or not 1 <= k <= e:
            raise OpError("MSL119", f"top_k = {k} must be between 1 and experts = {e}", "top_k")
        for arg in ("ffn", "shared_ffn"):
            if self.arg(node, arg) < 0 or (arg == "ffn" and node.args[arg] < 1):
                raise OpError("MSL119", f"{arg} must be positive", arg)
        routing.check(node)
        if self.arg(node, "shared_sigmoid") and not self.arg(node, "shared_ffn"):
            raise OpError(
                "MSL119",
                "shared_sigmoid gates the shared experts, and there are none",
                "shared_sigmoid",
                "give the shared experts a width (`shared_ffn = ...`) or drop shared_sigmoid",
            )
        return x

    def param_shapes(self, node, inputs, ctx):
        h = inputs[0][-1]
        e, f, s = node.args["experts"], node.args["ffn"], self.arg(node, "shared_ffn")
        experts, shared = self.matrices(node)
        shapes = {"router": (h, e)}
        shapes |= {m: (e, f, h) if m == "down" else (e, h, f) for m in experts}
        shapes |= {m: (s, h) if m == "shared_down" else (h, s) for m in shared}
        if self.arg(node, "shared_sigmoid"):
            shapes["shared_sigmoid"] = (h, 1)
        return shapes

    def layout(self, node, inputs, out_shape, ctx):
        """The hidden dim whole (the router and the experts read all of it), the
        experts' dim over ep. With a capacity their ffn dim over tp: the down
        projections give a partial sum over tp, all-reduced (reduce-scattered under
        sequence parallelism, as linear does). Dropless the experts are whole over tp
        and each tp rank takes tokens of its own into the Morph region (its work split
        over tp `within`), whose output is gathered over tp again; the shared experts
        stay split over tp, their partial sum all-reduced."""
        (x,) = inputs
        e, ep = node.args["experts"], ctx.mesh_sizes.get("ep", 1)
        if e % ep:
            raise OpError(
                "MSL212",
                f"ep = {ep} does not divide experts = {e}: each expert-parallel rank holds "
                "experts / ep whole experts",
                "experts",
                f"use an ep that divides {e} (and dp)",
            )
        shapes = self.param_shapes(node, [x.shape], ctx)
        g = MoeGeometry.of(node, x.shape, ctx)
        ffn_axes = g.tp_axes
        dropless = node.args.get("capacity") is None
        params = [Param("router", shapes["router"], declared(node, "router", 2))]
        for name, shape in shapes.items():
            if name == "router":
                continue
            default = (ffn_axes, ()) if name.endswith("down") else ((), ffn_axes)
            if name == "shared_sigmoid":
                default = ((), ())
            if name in self.expert_params:
                default = expert_split(node, ctx, name)
            split = declared(node, name, len(shape)) if name in node.param_shardings else default
            if name in self.expert_params and effective(split, ctx) != default:
                raise split_error(node, name, split, default, dropless)
            params.append(Param(name, shape, split))
        for p in params:
            if p.name in WHOLE and p.split != ((), ()):
                raise OpError(
                    "MSL210",
                    f"`{p.name}` of moe `{node.name}` cannot be split: {WHOLE[p.name]}",
                    p.name,
                    f"drop `{p.name} @ [...]`",
                )
        need = replace_last(without(x.split, ffn_axes), ())
        out = out_declared(node, len(out_shape)) or need
        # the busiest rank's copies: padded to capacity, or times the load imbalance
        moved = g.moved
        if not dropless:
            collectives = partial_sum(out, ffn_axes, prod(out_shape), "output")
        else:
            collectives = ()
            if self.arg(node, "shared_ffn"):
                collectives = partial_sum(out, ffn_axes, prod(out_shape), "shared output")
            if ffn_axes and not any(ffn_axes == s for s in out[:-1]):
                collectives += (Collective("AllGather", ffn_axes, prod(out_shape), "output"),)
        if ctx.mesh_sizes.get("ep", 1) > 1:
            # exposed: the experts' matmuls wait for the dispatch, the next op for the
            # combine, and the generated code overlaps neither with other work
            collectives = (
                Collective("AllToAll", ("ep",), moved, "dispatch", exposed=True),
                Collective("AllToAll", ("ep",), moved, "combine", exposed=True),
            ) + collectives
        within = ffn_axes if dropless else ()
        return Layout(
            inputs=(need,), output=out, params=tuple(params), collectives=collectives,
            within=within,
        )  # fmt: skip

    def backward_collectives(self, node, inputs, layout, ctx):
        """The gradients retrace the tokens' way: combine's AllToAll backward is a
        dispatch, dispatch's a combine, exposed as forward's (no expert's backward
        starts before the first, the input gradient leaves after the second). With a capacity the input gradient of the
        column-parallel gate/up is a partial sum over tp. Dropless, the output's
        AllGather over tp comes back as a ReduceScatter, and the tp ranks' token
        slices' input gradients are gathered (the shared experts' partial sum
        all-reduced)."""
        back = tuple(c for c in layout.collectives if c.kind == "AllToAll")
        tp = MoeGeometry.of(node, inputs[0].shape, ctx).tp_axes
        if not tp:
            return back
        x = prod(inputs[0].shape)
        if node.args.get("capacity") is not None:
            return back + (Collective("AllReduce", tp, x, "input gradient"),)
        for c in layout.collectives:
            if c.kind == "AllGather":
                back += (Collective("ReduceScatter", tp, c.elements, "output gradient"),)
        back += (Collective("AllGather", tp, x, "input gradient"),)
        if self.arg(node, "shared_ffn"):
            back += (Collective("AllReduce", tp, x, "shared input gradient"),)
        return back

    def saves(self, node, inputs, output, ctx):
        return costs.saves(self, node, inputs, output, ctx)

    def work(self, node, inputs, output, ctx):
        return costs.work(self, node, inputs, output, ctx)
