"""FLOPs of a training step, read off each op's `work` (msgen.ops): the one home
of the model FLOPs per step that `estimate`, `plan` and the generated train.py's
MFU share.

Model FLOPs follow Korthikanti et al. 2022 (Appendix A): the matmuls of forward
and backward (backward twice the forward), causal attention counted whole,
recompute not counted; for a GPT model that is 72·B·L·s·h²·(1 + s/6h + V/12hL).
Hardware FLOPs are what the kernels compute: a causal flash kernel skips the
masked half, and recompute reruns the forward of what it recomputes.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from msgen.analysis.facts import GraphFacts, OpFacts, context
from msgen.analysis.plan import Plan
from msgen.ir.models import Recompute
from msgen.ir.schema import RecomputeMode
from msgen.ops import OPS
from msgen.ops.base import Context, Layout, Work

NO_WORK = Work()


def op_work(of: OpFacts, ctx: Context) -> Work:
    """An op's forward work over its logical tensors, per micro-batch."""
    return OPS[of.node.kind].work(of.node, of.inputs, of.output, ctx)


def sharing(layout: Layout, sizes: dict[str, int]) -> int:
    """How many devices share an op's work: the mesh axes its layout splits
    anything over or its work within (a layernorm that tp does not split runs whole
    on every tp rank)."""
    axes = {a for split in (*layout.inputs, layout.output) for dim in split for a in dim}
    axes |= {a for p in layout.params for dim in p.split for a in dim}
    axes |= set(layout.within)
    if "dp" in axes:
        axes.discard("ep")  # ep is inside dp: its ranks share the dp ranks' tokens
    return prod(sizes.get(a, 1) for a in axes)


def recomputed(gf: GraphFacts, rc: Recompute | None) -> tuple[str, ...]:
    """The ops whose forward backward runs again: every op under `full`, the
    named ones under `select(...)`."""
    if rc is None or rc.mode == RecomputeMode.NONE:
        return ()
    if rc.mode == RecomputeMode.FULL:
        return tuple(gf.ops)
    return tuple(r.name for r in rc.ops if r.name in gf.ops)


def graph_ops(plan: Plan, name: str) -> list[OpFacts]:
    """The ops of a layer, or the network's own ops (its repeats aside)."""
    return [of for of in plan.graph(name).ops.values() if of.node.kind != "repeat"]


@dataclass(frozen=True)
class StepFlops:
    model: int  # per step, all devices
    hardware: int


def step_flops(plan: Plan) -> StepFlops:
    """Model and hardware FLOPs of one step over every device; multi-token
    prediction's modules (each its ops and one copy of its layer) included."""
    spec = plan.spec
    ctx = context(spec)
    model = hardware = 0

    def add(ops: list[OpFacts], copies: int, rerun: set[str]) -> None:
        nonlocal model, hardware
        for of in ops:
            fwd = op_work(of, ctx)
            bwd = OPS[of.node.kind].backward_work(of.node, fwd)
            model += copies * (fwd.matmul_flops + bwd.matmul_flops)
            again = fwd.kernel_flops if of.node.name in rerun else 0
            hardware += copies * (fwd.kernel_flops + bwd.kernel_flops + again)

    graphs = [(r.layer, r.count) for r in plan.repeats] + [("network", 1)]
    if plan.mtp is not None:
        graphs.append((plan.mtp.setting.layer, plan.mtp.setting.depth))
        add(list(plan.mtp.ops), plan.mtp.setting.depth, set())
    for name, copies in graphs:
        rerun = set(recomputed(plan.graph(name), spec.recompute.get(name)))
        add(graph_ops(plan, name), copies, rerun)
    return StepFlops(model * spec.micro_batches, hardware * spec.micro_batches)


def tokens_per_step(plan: Plan) -> int:
    """Token positions a step trains on: the network's input ([batch, seq]) times
    the micro-batches."""
    tokens = plan.spec.network.input
    return prod(tokens.shape) * plan.spec.micro_batches if tokens is not None else 0
