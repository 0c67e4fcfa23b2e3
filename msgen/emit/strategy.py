"""The parallel strategy file each rank of a semi-auto run is expected to write.

train.py has every rank write `rank_<r>/strategy.json` when its step compiles
(AutoParallel.save_param_strategy_file with every parameter recorded). `msgen compile`
writes the same from plan.json's layouts, one file per pipeline stage (the ranks of a
stage write the same file), in the JSON format MindSpore reads
(parallel/_parallel_serialization.py, `_build_json_strategy` and `_merge_json_strategy`):
so merging a run's checkpoints can be tested without a cluster, and a real run's files
compared with what the plan meant.

A stage's ranks are numbered `dp_index * tp + tp_index` (train.py's rank layout), so
its device matrix is `[dp, tp]`; a tensor dim split over tp maps to device dim 0 (dims
count from the right), over dp to 1, unsplit to -1. The optimizer moments
(`adam_m.*`, `adam_v.*`) and, when a step accumulates micro-batches, the
`accu_grads.*` buffers are clones of their weight and are laid out as it is. With the
parallel optimizer (zero > 0) a weight of at least HSDP_THRESHOLD_KB whose dim 0 is
not split over dp is further split along dim 0 over the ranks holding the same slice
(hsdp's default `threshold=64`, parallel/auto_parallel.py; the group's size and rank
stride are the `opt_weight_shard_size` and `opt_weight_shard_step` of
operator_info.cc's CreateGroupForOptShard), the stride read from plan.json's groups
(the dp group's for a dense weight, the edp group's for experts).

The experts of a `moe` op are split over ep on their first dim, ep inside dp in
Megatron-LM's order (tp innermost, then ep; msgen/analysis/mesh.py): the capacity
path's batched matmuls and the dropless Morph region lay them by Layouts over the
stage's devices `[dp / ep, ep, tp]` (msgen/ops/moe.py, templates/ops/moe*.py.j2),
so their device matrix is that one (rank `(edp_index * ep + ep_index) * tp +
tp_index`, the same ranks as the stage's `[dp, tp]`), ep mapping to device dim 1 and
tp to 0; the parallel optimizer shards them over the dp / ep ranks that hold the
same experts, ep * tp apart.
"""

from __future__ import annotations

import json
from math import prod

HSDP_THRESHOLD_KB = 64
_DEVICE_DIM = {"tp": 0, "dp": 1, "1": -1}
_EXPERT_DEVICE_DIM = {"tp": 0, "ep": 1, "1": -1}
_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


class Unsupported(ValueError):
    """A layout the strategy file's JSON form cannot write (a dim split over two axes)."""


def parameters(doc: dict) -> list[dict]:
    """plan.json's parameters one per path, each with its stages."""
    out = [{"path": p["path"], "shape": p["shape"], "split": p["split"], "stages": p["stages"]}
           for p in doc["params"]]  # fmt: skip
    for run in doc["layer_params"]:
        for copy in range(*run["copies"]):
            path = f"{run['layer']}.{copy}.{run['name']}"
            out.append({"path": path, "shape": run["shape"], "split": run["split"],
                        "stages": run["stages"]})  # fmt: skip
    return out


def layout(param: dict, doc: dict) -> dict:
    """The layout of `param` (one of `parameters(doc)`) in its stages' strategy file."""
    mesh = doc["mesh"]
    dp, tp, ep = mesh["dp"], mesh["tp"], mesh.get("ep", 1)
    expert = "ep" in param["split"]
    dims = _EXPERT_DEVICE_DIM if expert else _DEVICE_DIM
    if any(axis not in dims for axis in param["split"]):
        raise Unsupported(f"{param['path']} is split {param['split']}")
    tensor_map = [dims[axis] for axis in param["split"]]
    sizes = {"tp": tp, "dp": dp, "ep": ep}
    local = [n // sizes.get(a, 1) for n, a in zip(param["shape"], param["split"])]
    # the ranks holding the same slice: dp / ep of them for experts, dp otherwise
    replicas = dp // ep if expert else 1 if "dp" in param["split"] else dp
    shard_size = shard_step = 0
    dtype_bytes = _BYTES.get(doc["estimate"]["dtypes"]["weights"], 4)
    big = prod(param["shape"]) * dtype_bytes >= HSDP_THRESHOLD_KB * 1024
    if doc["estimate"]["zero"] > 0 and replicas > 1 and big and local[0] % replicas == 0:
        first = doc["groups"]["edp" if expert else "dp"][0]  # the replicas of rank 0
        shard_size, shard_step = replicas, first[1] - first[0]
    return {
        "dev_matrix": [dp // ep, ep, tp] if expert else [dp, tp],
        "tensor_map": tensor_map,
        "param_split_shape": [],
        "indices_offset": [],
        "field": 0,
        "opt_weight_shard_step": shard_step,
        "opt_weight_shard_size": shard_size,
    }


def strategy_files(doc: dict) -> dict[str, str]:
    """`strategy/stage_<s>.json` for each pipeline stage of a semi-auto plan.json."""
    accumulates = doc["mesh"]["pp"] > 1 or doc["micro_batches"] > 1
    prefixes = ("", "adam_m.", "adam_v.") + (("accu_grads.",) if accumulates else ())
    files = {}
    for stage in range(doc["mesh"]["pp"]):
        layouts = {
            prefix + p["path"]: layout(p, doc)
            for p in parameters(doc)
            if stage in p["stages"]
            for prefix in prefixes
        }
        # One parameter a line, for review. merge_pipeline_strategys reads a stage's
        # number from its strategy items.
        items = ",\n".join(
            f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(layouts.items())
        )
        files[f"strategy/stage_{stage}.json"] = (
            f'{{"current_stage": {stage},\n'
            f' "parallel_strategy_item": {{"network": {{"stage": {stage}}}}},\n'
            f' "parallel_layout_item": {{\n{items}\n }}\n}}\n'
        )
    return files
