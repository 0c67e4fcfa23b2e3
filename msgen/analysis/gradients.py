"""Where a step of micro-batches finds each parameter's gradient under semi-auto parallel.

MindSpore's parallel pass gives a parameter a mirror (the all-reduce of its gradient
over the devices holding the same slice) exactly when more than one device of its
stage holds that slice: OperatorInfo::InferMirrorOps asks CreateGroupByTensorMap for
the devices that share the parameter's slice (DeviceMatrix::GetDevicesByTensorMap over
the stage's devices) and, when there is one ("The dev size is 1, no need to create
group"), inserts none; the parallel optimizer's group is the same set and is skipped
alike (CreateGroupForOptShard), frontend/parallel/ops_info/operator_info.cc in
MindSpore's public source. With micro-batches the pass then puts a _VirtualAssignAdd
between each parameter (or its mirror) and its consumer (AddVirtualAssignAdd,
MicroBatchPostProcess in the parallel post-processing): its backward adds the
micro-batch's gradient into the parameter's `accu_grads` twin and returns 0
(ops/_grad_experimental/grad_comm_ops.py, get_bprop_virtual_assign_add). The
micro-step mirror's backward, or the parallel optimizer's _MicroStepAllGather in its
place, then reduces that buffer and returns the result as the parameter's gradient
when the parallel optimizer is on, and otherwise writes it back into the buffer and
returns 1.0 (same file, get_bprop_mirror_micro_step_operator and
get_bprop_micro_step_all_gather).

So with `zero` > 0 a parameter with replicas in its stage (dp replicas, norms and
biases a tp split leaves whole) has its gradient returned by the mirror, and one split
over every device of its stage (dp = 1 and split over tp; experts split over an ep that
spans all of dp) keeps it in `accu_grads` and receives 0; with `zero` = 0 every
gradient is in `accu_grads`.
"""

from __future__ import annotations

from msgen.analysis.plan import Plan
from msgen.ir.mesh import RankMesh
from msgen.ir.models import Split

MIRROR = "mirror"  # the gradient the parameter's mirror returns
ACCU_GRADS = "accu_grads"  # the accumulation buffer the pass adds every micro-batch into


def gradient_source(split: Split, mesh: RankMesh, zero: int) -> str:
    """MIRROR or ACCU_GRADS: where the step reads the micro-batches' reduced gradient
    of a parameter split so (the module's docstring says why; the devices holding
    the same slice are the mesh's to say)."""
    return MIRROR if zero > 0 and mesh.replicas(split) > 1 else ACCU_GRADS


def reads_accumulated(spec) -> bool:
    """Whether a step reads its gradients from the mirrors or `accu_grads` at all:
    semi-auto parallel over several micro-batches or pipeline stages (train.py's
    GradReducer). Otherwise the backward pass returns each gradient itself."""
    return spec.semi_auto and (spec.mesh.pp > 1 or spec.micro_batches > 1)


def gradient_sources(plan: Plan) -> tuple[tuple[str, str], ...]:
    """(parameter path pattern, source) for every parameter, in network order: a
    repeated layer's parameters once, as `<layer>.*.<op>.<param>` (every copy has the
    same split and its stage the same devices). None where the step does not read
    them (reads_accumulated). plan.json's `gradient_from` and train.py's GRADIENT_FROM
    are this table."""
    spec = plan.spec
    if not reads_accumulated(spec):
        return ()
    mesh = RankMesh.of(spec)
    out: dict[str, str] = {}
    for name, of in plan.graph("network").ops.items():
        if of.node.kind == "repeat":
            rep = next(r for r in plan.repeats if r.op == name)
            params = [(f"{rep.layer}.*.{op}", p) for op, p in plan.layer_params(rep.layer)]
        else:
            params = [(name, p) for p in of.params]
        for prefix, p in params:
            out[f"{prefix}.{p.name}"] = gradient_source(p.split, mesh, spec.train.zero)
    for op, p in plan.mtp_params():  # multi-token prediction's, by path as the network's
        out[f"{op}.{p.name}"] = gradient_source(p.split, mesh, spec.train.zero)
    return tuple(out.items())
