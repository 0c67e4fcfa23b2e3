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
parallel optimizer (zero > 0) a weight is further split along dim 0 over all the
ranks of its stage holding the same slice, when it passes hsdp's threshold and its
slice's first dim divides (msgen/analysis/optimizer_shard.py, from MindSpore's
source): `opt_weight_shard_size` is that group's size and `opt_weight_shard_step` the
stride operator_info.cc's CreateGroupForOptShard records for it. A real run's file
records the size as -1, the `optimizer_weight_shard_size` train.py leaves at "the
whole group", which MindSpore's readers resolve to that same size
(parallel/_tensor.py, _extract_layout_item); this file writes the number.

The experts of a `moe` op are split over ep on their first dim, ep inside dp in
Megatron-LM's order (tp innermost, then ep; msgen/ir/mesh.py): the capacity
path's batched matmuls and the dropless Morph region lay them by Layouts over the
stage's devices `[dp / ep, ep, tp]` (msgen/ops/moe.py, templates/ops/moe*.py.j2),
so their device matrix is that one (rank `(edp_index * ep + ep_index) * tp +
tp_index`, the same ranks as the stage's `[dp, tp]`), ep mapping to device dim 1 and
tp to 0; the parallel optimizer shards them over the ranks that hold the same
experts: dp / ep of them, ep * tp apart, with a capacity (ffn over tp); dp / ep * tp
dropless (whole over tp).
"""

from __future__ import annotations

import json

from msgen.analysis.optimizer_shard import shard_size, shard_step
from msgen.ir.mesh import RankMesh

_DEVICE_DIM = {"tp": 0, "dp": 1, "1": -1}
_EXPERT_DEVICE_DIM = {"tp": 0, "ep": 1, "1": -1}
_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


class Unsupported(ValueError):
    """A layout the strategy file's JSON form cannot write (a dim split over two axes)."""


def parameters(doc: dict) -> list[dict]:
    """plan.json's parameters one per path, each with its stages."""
    return _one_per_path(doc["params"], doc["layer_params"])


def buffers(doc: dict) -> list[dict]:
    """plan.json's buffers one per path (moe's correction bias): whole, no moments."""
    listed = doc.get("buffers", [])
    return _one_per_path([b for b in listed if "path" in b], [b for b in listed if "layer" in b])


def _one_per_path(entries: list[dict], runs: list[dict]) -> list[dict]:
    out = [{"path": p["path"], "shape": p["shape"], "split": p["split"], "stages": p["stages"]}
           for p in entries]  # fmt: skip
    for run in runs:
        for copy in range(*run["copies"]):
            path = f"{run['layer']}.{copy}.{run['name']}"
            out.append({"path": path, "shape": run["shape"], "split": run["split"],
                        "stages": run["stages"]})  # fmt: skip
    return out


def layout(param: dict, doc: dict, mesh: RankMesh) -> dict:
    """The layout of `param` (one of `parameters(doc)`) in its stages' strategy file."""
    expert = "ep" in param["split"]
    dims = _EXPERT_DEVICE_DIM if expert else _DEVICE_DIM
    if any(axis not in dims for axis in param["split"]):
        raise Unsupported(f"{param['path']} is split {param['split']}")
    split = tuple(() if axis == "1" else (axis,) for axis in param["split"])
    dtype_bytes = _BYTES.get(doc["estimate"]["dtypes"]["weights"], 4)
    shards = shard_size(tuple(param["shape"]), split, mesh, dtype_bytes, doc["estimate"]["zero"])
    return {
        "dev_matrix": mesh.dev_matrix(expert),
        "tensor_map": [dims[axis] for axis in param["split"]],
        "param_split_shape": [],
        "indices_offset": [],
        "field": 0,
        "opt_weight_shard_step": shard_step(split, mesh) if shards > 1 else 0,
        "opt_weight_shard_size": shards if shards > 1 else 0,
    }


def fused_items(doc: dict, stage: int) -> dict[str, dict]:
    """The strategy items of the fused kernels a stage's ranks run on Ascend (plan.json's
    `fused`), one per primitive of each op of each layer copy on the stage, named
    `<op path> <primitive>`; each with its stage, as MindSpore's items have."""
    items = {}
    for graph, ops in doc["ops"].items():
        if graph == "network":
            paths = [("", None)]
        else:
            runs = doc["layers"][graph]["placement"]
            paths = [
                (f"{graph}.{copy}.", run["stage"]) for run in runs for copy in range(*run["copies"])
            ]
        for op in ops:
            for kernel in op.get("fused", ()):
                for prefix, copy_stage in paths:
                    if kernel.get("stage", copy_stage) == stage:
                        name = f"{prefix}{op['name']} {kernel['primitive']}"
                        items[name] = {"stage": stage, "parallel_strategy": kernel["strategy"]}
    return items


def strategy_files(doc: dict) -> dict[str, str]:
    """`strategy/stage_<s>.json` for each pipeline stage of a semi-auto plan.json."""
    accumulates = doc["mesh"]["pp"] > 1 or doc["micro_batches"] > 1
    prefixes = ("", "adam_m.", "adam_v.") + (("accu_grads.",) if accumulates else ())
    mesh = RankMesh.of_plan(doc)
    files = {}
    for stage in range(doc["mesh"]["pp"]):
        layouts = {
            prefix + p["path"]: layout(p, doc, mesh)
            for p in parameters(doc)
            if stage in p["stages"]
            for prefix in prefixes
        }
        layouts |= {b["path"]: layout(b, doc, mesh) for b in buffers(doc) if stage in b["stages"]}
        # One parameter a line, for review. merge_pipeline_strategys reads a stage's
        # number from its strategy items.
        items = ",\n".join(
            f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(layouts.items())
        )
        # "network" first: MindSpore's merge reads the stage of the first item
        kernels = {"network": {"stage": stage}} | fused_items(doc, stage)
        ops = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in kernels.items())
        files[f"strategy/stage_{stage}.json"] = (
            f'{{"current_stage": {stage},\n'
            f' "parallel_strategy_item": {{\n{ops}\n }},\n'
            f' "parallel_layout_item": {{\n{items}\n }}\n}}\n'
        )
    return files
