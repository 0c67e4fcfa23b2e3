"""What a stage's devices do after the last backward, in seconds: the gradient
reductions (with the parallel optimizer's reduce-scatters and weight gathers) and the
optimizer step; the step-time model's (msgen/estimate/time.py) last terms."""

from __future__ import annotations

from math import prod

from msgen.analysis.optimizer_shard import shard_size
from msgen.estimate.memory import precision, slice_shape
from msgen.estimate.op_time import Machine
from msgen.ir.mesh import replica_axes
from msgen.ir.models import Spec
from msgen.ir.schema import LossScale
from msgen.ops.base import Collective


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
