"""One op's time per micro-batch on one device, and a graph's (a layer's copy, or the
network's own ops on a stage): the step-time model's (msgen/estimate/time.py) parts.

Every op costs its per-device work (msgen.ops `work`, divided over the devices sharing
it): matmul FLOPs at the device's peak times a calibrated efficiency, memory-bound bytes
at its HBM bandwidth times another, and a fixed overhead per kernel (which is what makes
small ops inefficient). Backward is each op's `backward_work`; recompute reruns the
forward (compute and collectives) of the ops it recomputes. Collectives are ring-costed
on the tier their groups span, the server's links when each group lies inside one server
as the mesh's owner lays the ranks (msgen/ir/mesh.py), else the network (all-reduce
2(n-1)/n of the bytes, all-gather and reduce-scatter (n-1)/n, plus a latency per step).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from msgen.analysis.facts import OpFacts
from msgen.estimate.flops import op_work, sharing
from msgen.estimate.kernels import ALL_FUSED, as_run, priced
from msgen.ir.devices import Device, Link
from msgen.ir.fieldwise import Fieldwise
from msgen.ir.mesh import RankMesh
from msgen.ops import OPS
from msgen.ops.base import Collective, Context, Layout, Work

RING_STEPS = {"AllReduce": 2, "AllGather": 1, "ReduceScatter": 1}


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
