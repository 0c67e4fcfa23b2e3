"""Step time per pipeline stage, from the op graph and the device catalogue.

Per micro-batch, every op on a stage costs its per-device work (msgen.ops
`work`, divided over the devices sharing it): matmul FLOPs at the device's peak
times a calibrated efficiency, memory-bound bytes at its HBM bandwidth times
another, and a fixed overhead per kernel (which is what makes small ops
inefficient). Backward is each op's `backward_work`; recompute reruns the
forward (compute and collectives) of the ops it recomputes. Collectives are
ring-costed on the tier their groups span, the server's links when each group lies
inside one server as the mesh's owner lays the ranks (msgen/ir/mesh.py), else
the network (all-reduce 2(n-1)/n of the bytes,
all-gather and reduce-scatter (n-1)/n, plus a latency per step); the device's
`tp_overlap` share of the tensor-parallel ones hidden behind the matmuls, except
an `exposed` collective's (moe's all-to-alls), which nothing hidden.
Pipeline sends go once forward and once backward per micro-batch and chunk, on the
tier the sends between a stage and its neighbours use.

A stage's work is its micro-batches' time; the slowest stage sets the pace,
the schedule adds its bubble ((p - 1)/m of that, divided by the chunks when
interleaved), and after the last backward come the gradient reductions, each
parameter's over the devices of its stage holding the same slice, on the tier that
group spans (the device's `dp_overlap` share hidden behind that backward, ZeRO's
weight gathers not), and the optimizer step, memory-bound. Step time is the
latest stage to finish. Every term is kept, so a report can show why.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

from msgen.analysis.facts import OpFacts, context
from msgen.analysis.optimizer_shard import shard_size
from msgen.analysis.plan import Plan
from msgen.estimate.flops import (
    StepFlops,
    graph_ops,
    op_work,
    recomputed,
    sharing,
    step_flops,
    tokens_per_step,
)
from msgen.estimate.kernels import ALL_FUSED, as_run, generated, paths, priced
from msgen.estimate.memory import Estimate, precision, slice_shape, stage_params
from msgen.ir.devices import Device, Link
from msgen.ir.fieldwise import Fieldwise
from msgen.ir.mesh import RankMesh, replica_axes
from msgen.ir.models import Spec
from msgen.ir.schema import LossScale
from msgen.ops import OPS
from msgen.ops.base import Collective, Context, Layout, Work

RING_STEPS = {"AllReduce": 2, "AllGather": 1, "ReduceScatter": 1}


# one op -----------------------------------------------------------------------


@dataclass(frozen=True)
class Cost(Fieldwise):
    """Seconds per micro-batch on one device, split by what they are."""

    compute: float = 0.0
    tp_comm: float = 0.0  # all of it; the hidden share is taken at the stage
    exposed_comm: float = 0.0  # collectives nothing hidden (`Collective.exposed`)

    @property
    def comm(self) -> float:
        """All of its communication: what the matmuls may hide and what nothing does."""
        return self.tp_comm + self.exposed_comm


@dataclass(frozen=True)
class Machine:
    """What the model needs to know about where a spec runs."""

    device: Device
    matmul_flops: float  # at the spec's compute dtype
    mesh: RankMesh  # the ranks, and which server each group is on
    sizes: dict[str, int]
    # the kernels run fused (msgen/estimate/kernels.py); every one: the ops' own prices
    fused: frozenset[str] = ALL_FUSED

    def kernel_time(self, work: Work, share: int, kernels: int) -> float:
        """`work` spread over `share` devices, run as `kernels` kernels."""
        cal = self.device.calibration
        return (
            work.kernel_flops / share / (self.matmul_flops * cal.matmul_efficiency)
            + work.memory_bytes / share / (self.device.hbm_bandwidth * cal.memory_efficiency)
            + kernels * cal.kernel_overhead
        )

    def link(self, axes: tuple[str, ...]) -> Link:
        """The tier the groups over `axes` use: the server's own links when each of
        them lies inside one server (as the mesh lays the ranks), else the network."""
        return self.device.intra if self.mesh.in_server(axes) else self.device.inter

    def send_link(self, stage: int) -> Link:
        """The tier of the pipeline sends between `stage` and its neighbours."""
        return self.device.intra if self.mesh.sends_in_server(stage) else self.device.inter

    def collective_time(self, kind: str, group_bytes: float, n: int, link: Link) -> float:
        """Ring cost of a collective over n devices on `link`; `group_bytes` is the
        whole tensor the group reduces or gathers."""
        if n <= 1 or group_bytes <= 0:
            return 0.0
        if kind == "AllToAll":
            # each device keeps 1/n of its share and sends the rest, one peer per step
            return (n - 1) / n * group_bytes / n / link.bus_bandwidth(n) + (n - 1) * link.latency
        steps = RING_STEPS[kind] * (n - 1)
        return steps / n * group_bytes / link.bus_bandwidth(n) + steps * link.latency

    def axes_time(self, c: Collective, group_bytes: float) -> float:
        n = self.mesh.size(c.axes)
        return self.collective_time(c.kind, group_bytes, n, self.link(c.axes))


def group_bytes(c: Collective, layout: Layout, mesh: RankMesh, itemsize: int) -> float:
    """Bytes of the tensor one group of the collective's axes handles: its logical
    elements over the ranks of the other axes the op splits things over (its work
    `within` too), as the mesh's owner counts them (an ep group is ep of the dp ranks)."""
    axes = {a for split in (*layout.inputs, layout.output) for dim in split for a in dim}
    axes |= set(layout.within)
    return c.elements * itemsize / mesh.size(tuple(sorted(axes)), without=c.axes)


@dataclass(frozen=True)
class OpCost:
    forward: Cost
    backward: Cost


def op_cost(of: OpFacts, ctx: Context, machine: Machine) -> OpCost:
    op = OPS[of.node.kind]
    layout = of.layout
    share = sharing(layout, machine.sizes)
    node = as_run(of.node, machine.fused)
    fwd, extra = priced(node, op_work(replace(of, node=node), ctx), machine.fused)
    bwd = op.backward_work(node, fwd)

    def comm(collectives) -> float:
        return sum(
            machine.axes_time(c, group_bytes(c, layout, machine.mesh, ctx.dtype_bytes))
            for c in collectives
        )

    def split(collectives) -> tuple[list[Collective], float]:
        """The collectives something may hide, and the seconds of those nothing hidden."""
        cs = list(collectives)
        return [c for c in cs if not c.exposed], comm(c for c in cs if c.exposed)

    moved = sum(r.bytes_per_device * r.times for r in of.redistributions)
    tp = machine.sizes["tp"]
    # an implicit redistribution moves its bytes once each way, inside the tp group
    link = machine.link(("tp",))
    redistribute = moved / link.bus_bandwidth(tp) if moved and tp > 1 else 0.0
    forward, forward_exposed = split(layout.collectives)
    backward, backward_exposed = split(op.backward_collectives(of.node, of.inputs, layout, ctx))
    blocking = comm(c for c in backward if c.blocking)
    # The others move the input gradient (or regather the input) while the weight
    # gradient, half of backward's matmuls, needs neither: they run alongside it
    # (Megatron's async tp communication, MindSpore's communication streams).
    weight_gradient = machine.kernel_time(Work(kernel_flops=bwd.kernel_flops // 2), share, 0)
    overlappable = comm(c for c in backward if not c.blocking)
    return OpCost(
        forward=Cost(
            machine.kernel_time(fwd, share, 1 + extra),
            comm(forward) + redistribute,
            forward_exposed,
        ),
        backward=Cost(
            machine.kernel_time(bwd, share, 2 * (1 + extra)),
            blocking + max(0.0, overlappable - weight_gradient) + redistribute,
            backward_exposed,
        ),
    )


@dataclass(frozen=True)
class GraphCost(Fieldwise):
    """One copy of a layer (or the network's own ops on a stage), per micro-batch."""

    forward: Cost
    backward: Cost
    recompute: Cost

    @property
    def total(self) -> Cost:
        return self.forward + self.backward + self.recompute


NO_COST = GraphCost(Cost(), Cost(), Cost())


def graph_cost(ops: list[OpFacts], rerun: set[str], ctx: Context, machine: Machine) -> GraphCost:
    total = NO_COST
    for of in ops:
        c = op_cost(of, ctx, machine)
        again = c.forward if of.node.name in rerun else Cost()
        total += GraphCost(c.forward, c.backward, again)
    return total


# the step ---------------------------------------------------------------------


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


def held_params(held, prec, zero: int, machine: Machine):
    """(elements on a device, parallel optimizer shards, replica axes) of each of a
    stage's parameters (memory.stage_params), its copies counted in the elements."""
    for p, n in held:
        yield (
            prod(slice_shape(p.shape, p.split, machine.sizes)) * n,
            shard_size(p.shape, p.split, machine.mesh, prec.weight, zero),
            replica_axes(p.split),
        )


def dp_comm(held, prec, zero: int, micro_batches: int, machine: Machine):
    """(gradient reduction, ZeRO's weight gathers) in seconds for one device of a
    stage holding the parameters `held`. Each gradient is reduced over the devices of
    the stage holding the same slice (its mirror's group: dp for a weight split over
    tp, dp · tp for one whole over tp, dp / ep for experts and dp / ep · tp for experts
    whole over tp), on the link that group spans: all-reduced, or, where the parallel
    optimizer splits the parameter, reduce-scattered and the updated weights
    all-gathered back; zero 3 also gathers them for every micro-batch's forward and
    backward."""
    groups: dict[tuple[tuple[str, ...], bool], int] = {}
    for elements, shards, axes in held_params(held, prec, zero, machine):
        if machine.mesh.size(axes) > 1:
            groups[axes, shards > 1] = groups.get((axes, shards > 1), 0) + elements
    reduce = gathers = 0.0
    for (axes, sharded), n in groups.items():
        kind = "ReduceScatter" if sharded else "AllReduce"
        reduce += machine.axes_time(Collective(kind, axes, n, "grads"), n * prec.grad)
        if sharded:
            gather = machine.axes_time(Collective("AllGather", axes, n, "weights"), n * prec.weight)
            gathers += gather * (1 + 2 * micro_batches if zero >= 3 else 1)
    return reduce, gathers


def optimizer_time(held, spec: Spec, machine: Machine) -> float:
    """The optimizer step over this device's share of the parameters `held` (the
    parallel optimizer's slice of each it splits), memory-bound: with a loss scale,
    unscale the gradients and check them for overflow (read and write); with
    clipping, read them for the norm; Adam reads the gradients and reads and writes
    the master copy (or the weights) and m, v; a master copy is then cast to the
    weights; the gradients are zeroed for the next step."""
    prec = precision(spec)
    zero = spec.train.zero
    share = sum(n // shards for n, shards, _ in held_params(held, prec, zero, machine))
    master = prec.master or prec.weight
    per_param = prec.grad + 2 * (master + prec.optimizer) + prec.grad  # Adam, then zeroing
    if spec.loss_scale != LossScale.NONE:
        per_param += 2 * prec.grad
    if spec.train.grad_clip is not None:
        per_param += prec.grad
    if prec.master:
        per_param += prec.master + prec.weight
    cal = machine.device.calibration
    return share * per_param / (machine.device.hbm_bandwidth * cal.memory_efficiency)
