"""Step time per pipeline stage, from the op graph and the device catalogue.

Per micro-batch, every op on a stage costs its per-device work, its collectives and its
recompute (msgen/estimate/op_time.py); the device's `tp_overlap` share of the
tensor-parallel collectives is hidden behind the matmuls, except an `exposed`
collective's (moe's all-to-alls), which nothing hides.
Pipeline sends go once forward and once backward per micro-batch and chunk, on the
tier the sends between a stage and its neighbours use.

A stage's work is its micro-batches' time; the slowest stage sets the pace,
the schedule adds its bubble ((p - 1)/m of that, divided by the chunks when
interleaved), and after the last backward come the gradient reductions, each
parameter's over the devices of its stage holding the same slice, on the tier that
group spans (the device's `dp_overlap` share hidden behind that backward, ZeRO's
weight gathers not), and the optimizer step, memory-bound
(msgen/estimate/update_time.py). Step time is the latest stage to finish. Every term is
kept, so a report can show why.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from msgen.analysis.facts import context
from msgen.analysis.plan import Plan
from msgen.estimate.flops import StepFlops, graph_ops, recomputed, step_flops, tokens_per_step
from msgen.estimate.kernels import generated, paths
from msgen.estimate.memory import Estimate, precision, slice_shape, stage_params
from msgen.estimate.op_time import NO_COST, Cost, Machine, graph_cost
from msgen.estimate.update_time import dp_comm, optimizer_time
from msgen.ir.devices import Device
from msgen.ir.mesh import RankMesh


@dataclass(frozen=True)
class StageTime:
    """Seconds per step on one device of a stage; the terms add up to `total_s`."""

    stage: int
    forward_s: float  # compute, all micro-batches
    backward_s: float
    recompute_s: float
    tp_comm_s: float  # not hidden behind the matmuls (moe's all-to-alls among them)
    tp_comm_hidden_s: float
    pp_comm_s: float
    bubble_s: float  # the schedule's warm-up and drain
    idle_s: float  # waiting for the slowest stage
    dp_comm_s: float  # not hidden behind the last backward
    dp_comm_hidden_s: float
    optimizer_s: float

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s + self.recompute_s

    @property
    def total_s(self) -> float:
        return (
            self.compute_s
            + self.tp_comm_s
            + self.pp_comm_s
            + self.bubble_s
            + self.idle_s
            + self.dp_comm_s
            + self.optimizer_s
        )


@dataclass(frozen=True)
class LayerTime:
    """One copy of a repeated layer, one micro-batch, on one device: forward and
    backward (recompute included) with the collectives not hidden."""

    layer: str
    forward_s: float
    backward_s: float


@dataclass(frozen=True)
class StepTime:
    device: str
    layers: tuple[LayerTime, ...]
    stages: tuple[StageTime, ...]
    bubble_fraction: float
    flops: StepFlops
    tokens_per_step: int
    devices: int
    peak_flops: float
    # (kernel, "fused" or "basic"): the path priced for each (msgen/estimate/kernels.py)
    kernels: tuple[tuple[str, str], ...] = ()

    @property
    def step_s(self) -> float:
        return max(s.total_s for s in self.stages)

    @property
    def tokens_per_s_per_device(self) -> float:
        return self.tokens_per_step / self.step_s / self.devices

    @property
    def mfu(self) -> float:
        return self.flops.model / (self.step_s * self.devices * self.peak_flops)

    @property
    def hfu(self) -> float:
        return self.flops.hardware / (self.step_s * self.devices * self.peak_flops)


def bubble_fraction(plan: Plan) -> float:
    """Idle share of the slowest stage's work: (p - 1)/m for 1F1B and GPipe,
    divided by the chunks when interleaved (Narayanan et al. 2021)."""
    p, m = plan.stages, plan.spec.micro_batches
    return (p - 1) / (m * plan.chunks) if p > 1 else 0.0


def boundary_bytes(plan: Plan, layer: str, sizes: dict[str, int]) -> int:
    """Bytes per device of what a stage sends the next: a layer's output."""
    out = plan.graph(layer).output
    return prod(slice_shape(out.shape, out.split, sizes)) * out.itemsize if out else 0


def unhidden(cost: Cost, overlap: float) -> float:
    """Compute and the communication its matmuls do not hide: they hide `overlap` of
    the tp communication (never more than the compute), none of the exposed."""
    return cost.compute + cost.comm - min(cost.tp_comm * overlap, cost.compute)


def step_time(
    plan: Plan, est: Estimate, device: Device | None = None, fused: frozenset[str] | None = None
) -> StepTime | None:
    """The step-time model of a checked spec on its device, or on `device` (None
    on a device the catalogue lacks), with the kernels the generated code runs fused,
    or those of `fused` (a published run's: msgen/estimate/kernels.py)."""
    spec = plan.spec
    device = device or est.device
    if device is None:
        return None
    sizes = dict(est.mesh)
    ctx = context(spec)
    if fused is None:
        fused = generated(plan)
    machine = Machine(
        device, device.matmul_flops[spec.model.dtype], RankMesh.of(spec), sizes, fused
    )
    cal = device.calibration
    m = spec.micro_batches
    per_copy = {
        r.layer: graph_cost(
            graph_ops(plan, r.layer),
            set(recomputed(plan.graph(r.layer), spec.recompute.get(r.layer))),
            ctx,
            machine,
        )
        for r in plan.repeats
    }
    network = [NO_COST] * plan.stages
    for of in graph_ops(plan, "network"):
        network[plan.network_op_stage(of.node)] += graph_cost([of], set(), ctx, machine)
    if plan.mtp is not None:  # the modules run on the last stage
        mod = plan.mtp.setting
        rerun = set(recomputed(plan.graph(mod.layer), spec.recompute.get(mod.layer)))
        block = graph_cost(graph_ops(plan, mod.layer), rerun, ctx, machine)
        own = graph_cost(list(plan.mtp.ops), set(), ctx, machine)
        network[-1] += (own + block) * mod.depth
    work, parts = [], []
    for stage in range(plan.stages):
        copies = plan.copies_on_stage(stage)
        cost = network[stage]
        for layer, n in copies.items():
            cost += per_copy[layer] * n
        total = cost.total
        hidden = total.compute + total.comm - unhidden(total, cal.tp_overlap)
        pp = 0.0
        if plan.stages > 1 and copies:
            sent = boundary_bytes(plan, next(iter(copies)), sizes)
            p2p = machine.send_link(stage)
            pp = 2 * plan.chunks * (sent / (p2p.bandwidth * p2p.efficiency) + p2p.latency)
        parts.append((cost, hidden, pp))
        work.append(m * (total.compute + total.comm - hidden + pp))
    slowest = max(work)
    bubble = bubble_fraction(plan) * slowest
    prec = precision(spec)
    held = stage_params(plan)
    stages = []
    for stage, ((cost, hidden, pp), mine) in enumerate(zip(parts, work, strict=True)):
        dp_total, dp_gathers = dp_comm(held[stage], prec, spec.train.zero, m, machine)
        last_backward = cost.backward.compute + cost.recompute.compute
        dp_hidden = min(dp_total * cal.dp_overlap, last_backward)
        stages.append(
            StageTime(
                stage=stage,
                forward_s=m * cost.forward.compute,
                backward_s=m * cost.backward.compute,
                recompute_s=m * cost.recompute.compute,
                tp_comm_s=m * (cost.total.comm - hidden),
                tp_comm_hidden_s=m * hidden,
                pp_comm_s=m * pp,
                bubble_s=bubble,
                idle_s=slowest - mine,
                dp_comm_s=dp_total - dp_hidden + dp_gathers,
                dp_comm_hidden_s=dp_hidden,
                optimizer_s=optimizer_time(held[stage], spec, machine),
            )
        )
    flops = step_flops(plan)
    layers = tuple(
        LayerTime(
            layer,
            unhidden(cost.forward, cal.tp_overlap),
            unhidden(cost.backward + cost.recompute, cal.tp_overlap),
        )
        for layer, cost in per_copy.items()
    )
    return StepTime(
        device=device.name,
        layers=layers,
        stages=tuple(stages),
        bubble_fraction=bubble_fraction(plan),
        flops=flops,
        tokens_per_step=tokens_per_step(plan),
        devices=est.devices,
        peak_flops=device.peak_flops,
        kernels=paths(spec, fused),
    )
