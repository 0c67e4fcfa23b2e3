"""A run's checkpoints merge with MindSpore's own tools, on the CPU.

Semi-auto parallel cannot run on the CPU, so the test lays out a tiny tree's output as
train.py's save() writes it: every rank folder holds its slices of the weights and the
optimizer moments (`step_*.ckpt`) and its strategy file (`strategy.json`, the one
`msgen compile` wrote for its stage). The slices are cut from one full checkpoint by
plan.json's splits and train.py's rank layout (rank = (stage * dp + dp_index) * tp +
tp_index), and, for a parameter the strategy file marks as sharded by the parallel
optimizer, along dim 0 over its group in rank order (operator_info.cc,
CreateGroupForOptShard). MindSpore's merge_pipeline_strategys and transform_checkpoints
(parallel/checkpoint_transform.py) must then give back every full tensor.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.emit_fixtures import SPECS, compile_spec, every_param


def cut(
    array: np.ndarray, split: list[str], layout: dict, coords: dict[str, int], mesh: dict
) -> np.ndarray:
    """A rank's slice, cut by plan.json's split and train.py's rank layout on purpose,
    not by msgen.ckpt.slices: slices.py reads the strategy file under test, and slices
    cut from a wrong tensor_map (tp and dp swapped in msgen/emit/strategy.py) merge
    back whole through that same file, so this test could not fail. slices.py is held
    against MindSpore's own cut in tests/test_ckpt_hf_ranks.py."""
    for dim, axis in enumerate(split):
        if axis != "1":
            array = np.split(array, mesh[axis], axis=dim)[coords[axis]]
    size, step = layout["opt_weight_shard_size"], layout["opt_weight_shard_step"]
    if size > 0:
        # the ranks of the group are `step` apart; a rank holds its place's chunk
        array = np.split(array, size, axis=0)[coords["in_stage"] // step % size]
    return array


def write_run(tree: Path, run: Path, full: dict[str, np.ndarray]) -> None:
    import mindspore as ms

    doc = json.loads((tree / "plan.json").read_text())
    mesh = doc["mesh"]
    dp, tp, pp = mesh["dp"], mesh["tp"], mesh["pp"]
    params = {p["path"]: p for p in every_param(doc)}
    for rank in range(dp * tp * pp):
        stage = rank // (dp * tp)
        coords = {"dp": rank // tp % dp, "tp": rank % tp, "in_stage": rank % (dp * tp)}
        folder = run / f"rank_{rank}"
        folder.mkdir(parents=True)
        strategy = tree / "strategy" / f"stage_{stage}.json"
        shutil.copy(strategy, folder / "strategy.json")
        layouts = json.loads(strategy.read_text())["parallel_layout_item"]
        state = [{"name": "global_step", "data": ms.Tensor(full["global_step"])}]
        for name, value in full.items():
            path = name.removeprefix("adam_m.").removeprefix("adam_v.")
            if path not in params or stage not in params[path]["stages"]:
                continue
            # a moment is sliced as its weight is, whatever the strategy file records
            sliced = cut(value, params[path]["split"], layouts[path], coords, mesh)
            state.append({"name": name, "data": ms.Tensor(sliced)})
        ms.save_checkpoint(state, str(folder / "step_00000001.ckpt"))


def full_state(tree: Path) -> dict[str, np.ndarray]:
    doc = json.loads((tree / "plan.json").read_text())
    rng = np.random.default_rng(0)
    full = {"global_step": np.array([1], np.int32)}
    for p in every_param(doc):
        for prefix in ("", "adam_m.", "adam_v."):
            full[prefix + p["path"]] = rng.standard_normal(p["shape"]).astype(np.float32)
    return full


def merge(run: Path, out: Path) -> dict[str, np.ndarray]:
    import mindspore as ms

    strategies = out / "strategies"
    strategies.mkdir(parents=True)
    for folder in sorted(run.iterdir()):
        shutil.copy(folder / "strategy.json", strategies / f"{folder.name}.json")
    merged = out / "merged_strategy.json"
    ms.parallel.merge_pipeline_strategys(str(strategies), str(merged))
    ms.parallel.transform_checkpoints(str(run), str(out / "merged"), "full", str(merged), None)
    (path,) = (out / "merged" / "rank_0").glob("*.ckpt")
    return {name: p.asnumpy() for name, p in ms.load_checkpoint(str(path)).items()}


@pytest.mark.parametrize("zero", [0, 1])
def test_transform_checkpoints_merges_the_slices_into_the_full_tensors(zero, tmp_path):
    tree = compile_spec(SPECS["tiny"], tmp_path / "tree", "--set", f"train.zero={zero}")
    sharded = [
        name
        for stage in tree.glob("strategy/stage_*.json")
        for name, layout in json.loads(stage.read_text())["parallel_layout_item"].items()
        if layout["opt_weight_shard_size"] > 0
    ]
    assert bool(sharded) == (zero > 0)  # the parallel optimizer's fields are exercised
    full = full_state(tree)
    write_run(tree, tmp_path / "run", full)
    merged = merge(tmp_path / "run", tmp_path / "out")
    for name, value in full.items():
        assert name in merged, name
        np.testing.assert_array_equal(merged[name], value, err_msg=name)
