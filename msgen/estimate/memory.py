"""Peak memory per device for each pipeline stage, read off the op graph.

Every number comes from the facts the check passes built: each parameter with
its own split, and the tensors each op saves for backward (`OpDef.saves`).
Nothing here knows an architecture. The rules are DESIGN.md's "Memory
accounting rules"; reference/estimator.md has the published numbers they
reproduce. What a layer keeps and what its recompute re-makes in backward:
msgen/estimate/activations.py. Devices of one stage hold equal slices (splits divide evenly), so
one device stands for its stage; a dim that did not divide would be rounded up
(the most-loaded device).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from math import ceil, prod

from msgen.analysis.optimizer_shard import shard_size
from msgen.analysis.plan import Plan
from msgen.estimate.activations import (
    layer_activation_bytes,
    network_saves,
    recompute_label,
    recompute_working_bytes,
    slice_shape,
)
from msgen.ir.devices import DEVICES, Device
from msgen.ir.fieldwise import Fieldwise
from msgen.ir.mesh import RankMesh
from msgen.ir.models import Spec
from msgen.ir.schema import DTYPE_BYTES, Schedule
from msgen.ops.base import Param

GiB = 2**30
MiB = 2**20
ADAM_STATE_BYTES = 8  # m and v, fp32
HCCL_BUFFER = 200 * MiB  # HCCL_BUFFSIZE's default; each communicator takes two
HEADROOM = Fraction(1, 10)  # MindSpore's peak with fragments is about 10% above the used peak


# precision and model states ---------------------------------------------------


@dataclass(frozen=True)
class Precision:
    """Bytes stored per parameter, by what they hold, and the dtypes behind them."""

    weight: int
    master: int  # a separate master copy (0: the weights are the master)
    grad: int
    optimizer: int  # Adam's m and v
    weight_dtype: str
    master_dtype: str | None
    grad_dtype: str

    @property
    def per_param(self) -> int:
        return self.weight + self.master + self.grad + self.optimizer


def precision(spec: Spec) -> Precision:
    param = spec.model.param_dtype
    master = spec.train.master_weights
    master = master if master and master != param else None
    grad = spec.train.grad_dtype or param
    return Precision(
        weight=DTYPE_BYTES[param],
        master=DTYPE_BYTES[master] if master else 0,
        grad=DTYPE_BYTES[grad],
        optimizer=ADAM_STATE_BYTES,
        weight_dtype=param,
        master_dtype=master,
        grad_dtype=grad,
    )


@dataclass(frozen=True)
class ModelStates(Fieldwise):
    params: int  # elements per device: the model-parallel slices, before ZeRO
    weights: int  # bytes
    grads: int
    accumulation: int  # the gradient accumulation buffer, when a step has micro-batches
    optimizer: int  # master copy and Adam states


NO_STATES = ModelStates(0, 0, 0, 0, 0)


def param_states(
    params: list[Param], sizes: dict[str, int], prec: Precision, zero: int
) -> ModelStates:
    """Weights, gradients, accumulation buffer and optimizer states of `params` on one
    device, as MindSpore's parallel optimizer (hsdp level `zero`) lays them out.

    Every level stores a slice of each weight (its first dim) and slices the optimizer
    states and master copy alike (`hsdp`, mindspore/parallel/auto_parallel.py), over
    the devices of the stage holding the same model-parallel slice: dp of them for a
    weight split over tp, dp · tp for one whole over tp, dp / ep (· tp when whole over
    it) for experts; a parameter under hsdp's 64 KB threshold, or whose slice's first
    dim that count does not divide, stays whole (msgen/analysis/optimizer_shard.py
    cites MindSpore's source). Levels 1 and 2 keep each weight's forward AllGather
    until backward (level 3 gathers again before backward "to release the memory used
    by the forward pass allgather"), so they hold the whole weight beside the slice.
    The AllGather's backward is a ReduceScatter (ops/_grad_experimental/
    grad_comm_ops.py, get_bprop_all_gather and the micro-step variants), so at every
    level the optimizer receives the gradient's slice. Level 2 is level 1 with
    `gradient_accumulation_shard`: only the accumulation buffer is sliced; level 3
    turns that off again (set_parallel_optimizer_config in
    mindspore/parallel/_auto_parallel_context.py).
    """
    return held_states([(p, 1) for p in params], sizes, prec, zero)


def held_states(
    held: list[tuple[Param, int]], sizes: dict[str, int], prec: Precision, zero: int
) -> ModelStates:
    """param_states of parameters each held `n` times (`(param, n)`, stage_params)."""
    mesh = RankMesh.of_sizes(sizes)
    params = weights = grads = accumulation = optimizer = 0
    for p, copies in held:
        n = prod(slice_shape(p.shape, p.split, sizes))
        shards = shard_size(p.shape, p.split, mesh, prec.weight, zero)
        part = n // shards
        gathered = n if shards > 1 and zero < 3 else 0
        params += n * copies
        weights += (part + gathered) * prec.weight * copies
        grads += part * prec.grad * copies
        accumulation += (part if zero == 2 else n) * prec.grad * copies
        optimizer += part * (prec.master + prec.optimizer) * copies
    return ModelStates(params, weights, grads, accumulation, optimizer)


def stage_params(plan: Plan) -> list[list[tuple[Param, int]]]:
    """The parameters a device of each stage holds, each with its number of copies
    there: a repeated layer's once per copy on the stage, a network op's on each
    stage that runs it."""
    held: list[list[tuple[Param, int]]] = [[] for _ in range(plan.stages)]
    for op, p in plan.network_params():
        for stage in plan.network_param_stages(op):
            held[stage].append((p, 1))
    for stage in range(plan.stages):
        for layer, n in plan.copies_on_stage(stage).items():
            held[stage].extend((p, n) for _, p in plan.layer_params(layer))
    return held


# activations ------------------------------------------------------------------


def in_flight(spec: Spec, stage: int) -> Fraction:
    """Micro-batches whose activations a stage holds at its peak.

    pp = 1: one (gradient accumulation runs each micro-batch's forward and
    backward before the next). gpipe: all n. 1F1B: min(n, pp - stage).
    Interleaved with m > 1 chunks (Megatron's schedule): stage s runs
    2(pp - s - 1) + (m - 1)pp + 1 chunk forwards before its first backward, at
    most all n·m of them; a chunk is 1/m of the stage's layers. On the first stage
    that is pp·(1 + (pp - 1)/(pp·m)) micro-batches, estimator.md's penalty factor.
    m = 1 is plain 1F1B.
    """
    pp, n = spec.mesh.pp, spec.micro_batches
    if pp == 1:
        return Fraction(1)
    if spec.pipeline.schedule == Schedule.GPIPE:
        return Fraction(n)
    m = spec.pipeline.chunks
    if spec.pipeline.schedule == Schedule.INTERLEAVED and m > 1:
        chunks = min(2 * (pp - stage - 1) + (m - 1) * pp + 1, n * m)
        return Fraction(chunks, m)
    return Fraction(min(n, pp - stage))


# the estimate -----------------------------------------------------------------


@dataclass(frozen=True)
class LayerKind:
    """One repeated layer's copies on a stage."""

    layer: str
    copies: int
    recompute: str
    activation_bytes_per_layer: int
    recompute_working_bytes: int  # one copy, one micro-batch (activations.py)


@dataclass(frozen=True)
class StageMemory:
    stage: int
    layers: int
    layer_kinds: tuple[LayerKind, ...]
    params: int
    weights_bytes: int
    grads_bytes: int
    accumulation_bytes: int
    optimizer_bytes: int
    activation_bytes_per_layer: int
    in_flight_micro_batches: Fraction
    activations_bytes: int
    other_activations_bytes: int
    logits_bytes: int
    # The recomputed layer's working memory: once per stage, one layer and one
    # micro-batch at a time (the largest kind's), less what the network's ops after
    # the layers saved for that micro-batch, freed before any layer's backward.
    recompute_working_bytes: int
    hccl_bytes: int
    budget_bytes: int | None
    freed_before_layers_bytes: int = 0  # what the working memory is net of

    @property
    def total_bytes(self) -> int:
        return (
            self.weights_bytes
            + self.grads_bytes
            + self.accumulation_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.other_activations_bytes
            + self.logits_bytes
            + self.recompute_working_bytes
            + self.hccl_bytes
        )

    @property
    def headroom_bytes(self) -> int:
        return ceil(self.total_bytes * HEADROOM)

    @property
    def fits(self) -> bool:
        return self.budget_bytes is None or self.total_bytes <= self.budget_bytes

    @property
    def tight(self) -> bool:
        """Fits, but not with the fragmentation headroom on top."""
        return (
            self.fits
            and self.budget_bytes is not None
            and (self.total_bytes + self.headroom_bytes > self.budget_bytes)
        )


@dataclass(frozen=True)
class Estimate:
    model: str
    device: Device | None
    mesh: dict[str, int]
    params_total: int
    params_active: int  # what one token's forward reads (mixtures of experts: fewer)
    params_mtp: int  # the multi-token prediction modules' own, inside params_total
    precision: Precision
    zero: int
    schedule: str
    chunks: int
    micro_batches: int
    budget_bytes: int | None
    budget_source: str  # budget.device_memory | device
    stages: tuple[StageMemory, ...]

    @property
    def devices(self) -> int:
        return prod(self.mesh[axis] for axis in ("dp", "tp", "pp"))  # ep is inside dp

    @property
    def fits(self) -> bool:
        return all(s.fits for s in self.stages)

    @property
    def peak(self) -> StageMemory:
        """The stage with the largest total (the first of equals)."""
        return max(self.stages, key=lambda s: s.total_bytes)


def budget_of(spec: Spec) -> tuple[int | None, str]:
    """The budget per device and where it comes from: `budget.device_memory`,
    else the device's memory minus its runtime reserve (None: unknown device)."""
    if spec.budget.device_memory is not None:
        return spec.budget.device_memory, "budget.device_memory"
    device = DEVICES.get(spec.cluster.device)
    return (device.usable_bytes if device else None), "device"


def hccl_bytes(spec: Spec) -> int:
    """Two buffers for each communicator: one per mesh axis of size > 1."""
    axes = sum(1 for n in (spec.mesh.dp, spec.mesh.tp, spec.mesh.pp, spec.mesh.ep) if n > 1)
    return axes * 2 * HCCL_BUFFER


def estimate(plan: Plan) -> Estimate:
    spec = plan.spec
    mesh = spec.mesh
    sizes = {"dp": mesh.dp, "tp": mesh.tp, "pp": mesh.pp, "ep": mesh.ep}
    prec = precision(spec)
    zero = spec.train.zero
    budget, source = budget_of(spec)
    per_copy = {
        r.layer: (
            layer_activation_bytes(plan.graph(r.layer), spec.recompute.get(r.layer), sizes),
            recompute_working_bytes(plan.graph(r.layer), spec.recompute.get(r.layer), sizes),
        )
        for r in plan.repeats
    }
    held = stage_params(plan)
    others, logits, freed = network_saves(plan, sizes)
    accumulate = spec.micro_batches > 1
    hccl = hccl_bytes(spec)
    stages = []
    for stage in range(plan.stages):
        copies = plan.copies_on_stage(stage)
        states = held_states(held[stage], sizes, prec, zero)
        kinds = []
        for layer, n in copies.items():
            act, working = per_copy[layer]
            label = recompute_label(spec.recompute.get(layer))
            kinds.append(LayerKind(layer, n, label, act, working))
        layers = sum(copies.values())
        per_micro_batch = sum(k.copies * k.activation_bytes_per_layer for k in kinds)
        flight = in_flight(spec, stage)
        working = max((k.recompute_working_bytes for k in kinds), default=0)
        stages.append(
            StageMemory(
                stage=stage,
                layers=layers,
                layer_kinds=tuple(kinds),
                params=states.params,
                weights_bytes=states.weights,
                grads_bytes=states.grads,
                accumulation_bytes=states.accumulation if accumulate else 0,
                optimizer_bytes=states.optimizer,
                # the mean over the stage's layers: exact with one layer kind
                activation_bytes_per_layer=ceil(Fraction(per_micro_batch, layers or 1)),
                in_flight_micro_batches=flight,
                activations_bytes=ceil(per_micro_batch * flight),
                other_activations_bytes=ceil(others[stage] * flight),
                logits_bytes=ceil(logits[stage] * flight),
                recompute_working_bytes=max(0, working - freed[stage]),
                hccl_bytes=hccl,
                budget_bytes=budget,
                freed_before_layers_bytes=freed[stage] if working else 0,
            )
        )
    return Estimate(
        model=spec.model.name,
        device=DEVICES.get(spec.cluster.device),
        mesh=dict(sizes),
        params_total=plan.params_total,
        params_active=plan.params_active,
        params_mtp=plan.params_mtp,
        precision=prec,
        zero=zero,
        schedule=spec.pipeline.schedule,
        chunks=spec.pipeline.chunks,
        micro_batches=spec.micro_batches,
        budget_bytes=budget,
        budget_source=source,
        stages=tuple(stages),
    )
