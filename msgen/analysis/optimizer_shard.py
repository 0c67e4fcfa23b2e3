"""How the parallel optimizer (`train.zero` > 0, MindSpore's hsdp) splits a parameter.

MindSpore splits a parameter's slice along its first dim over the devices of its
pipeline stage that hold that same slice (frontend/parallel/ops_info/operator_info.cc,
CreateGroupForOptShard: DeviceMatrix::GetDevicesByTensorMap over the stage's devices,
the group its mirror all-reduces over too), when
- the parameter is at least hsdp's threshold, 64 KB by default, counted on its whole
  shape in its own dtype (parallel_optimizer/opt_param_mgr.cc, SplitParam and
  ComputeMemorySize; step_parallel.cc's SetParallelShape asks before it gives the
  parameter its sliced shape), and
- the slice's first dim divides by that group's size (tensor_layout.cc,
  GenerateOptShardSliceShape: the first dim over its model-parallel split times the
  repeated devices).
The group is every such device: train.py calls `hsdp(optimizer_level=...)`, leaving
`shard_size` at -1 ("the data parallel group of each parameter",
mindspore/parallel/auto_parallel.py) and `threshold` at 64, which is what mindformers
2.0.0 sets by default too (trainer/training_args.py: optimizer_weight_shard_size -1,
parallel_optimizer_threshold 64). So a parameter split over tp is split over its dp
ranks, one whole over tp (a norm, a router, the positions table) over all dp · tp of
its stage, a dropless expert (whole over tp) over dp / ep · tp, and a capacity expert
(ffn over tp) over dp / ep. The devices are the mesh's to say (RankMesh.replicas);
this module adds the threshold and the division.
"""

from __future__ import annotations

from functools import cache
from math import prod

from msgen.ir.mesh import RankMesh

HSDP_THRESHOLD = 64 * 1024  # bytes: hsdp(threshold=64), in KB, train.py's default


@cache  # the estimate asks for every parameter of every stage of every plan it weighs
def shard_size(shape, split, mesh: RankMesh, dtype_bytes: int, zero: int) -> int:
    """The devices the parallel optimizer splits one device's slice of a parameter
    over along its first dim (1: it stays whole). `split` names the axes splitting
    each dim (`(("tp",), ())`), both tuples; `dtype_bytes` is the parameter's element
    size."""
    replicas = mesh.replicas(split)
    if zero == 0 or replicas == 1 or not shape:
        return 1
    if prod(shape) * dtype_bytes < HSDP_THRESHOLD:
        return 1
    first = shape[0] // prod(mesh.size(axis) for axis in split[0])
    return replicas if first % replicas == 0 else 1


def shard_step(split, mesh: RankMesh) -> int:
    """The rank stride MindSpore records for the group (a strategy file's
    `opt_weight_shard_step`): its last rank less its first over its size less one,
    divided as integers (CreateGroupForOptShard). A group not evenly strided (dropless
    experts at ep and tp > 1: ranks 0, 1, 4, 5 at dp 4, ep 2, tp 2) has no one stride;
    MindSpore's readers then go by the device matrix (parallel/_tensor.py,
    _construct_tensor_layout_helper)."""
    group = mesh.replica_group(split, 0)
    return (group[-1] - group[0]) // (len(group) - 1) if len(group) > 1 else 0
