"""A run's checkpoints merge with MindSpore's own tools, on the CPU.

Semi-auto parallel cannot run on the CPU, so the test lays out a tiny tree's output as
train.py's save() writes it: every rank folder holds its slices of the weights and the
optimizer moments (`step_*.ckpt`) and its strategy file (`strategy.json`, the one
`msgen compile` wrote for its stage). The slices are cut from one full checkpoint by
plan.json's splits and its rank groups (a rank's index in its tp, dp or ep group picks
its slice), and, for a parameter the strategy file marks as sharded by the parallel
optimizer, along dim 0 over the ranks holding the same slice, in rank order
(operator_info.cc, CreateGroupForOptShard), the ranks read from plan.json's groups. MindSpore's merge_pipeline_strategys and transform_checkpoints
(parallel/checkpoint_transform.py) must then give back every full tensor.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.emit_fixtures import SPECS, compile_spec, every_param, holders


def place(doc: dict, axis: str, rank: int) -> int:
    """`rank`'s index in its group over `axis`, from plan.json's groups."""
    return next(g for g in doc["groups"][axis] if rank in g).index(rank)


def cut(array: np.ndarray, param: dict, layout: dict, rank: int, doc: dict) -> np.ndarray:
    """A rank's slice, cut by plan.json's split and groups on purpose, not by
    msgen.ckpt.slices: slices.py reads the strategy file under test, and slices cut
    from a wrong tensor_map (tp and dp swapped in msgen/emit/strategy.py) merge back
    whole through that same file, so this test could not fail. slices.py is held
    against MindSpore's own cut in tests/test_ckpt_hf_ranks.py."""
    for dim, axis in enumerate(param["split"]):
        if axis != "1":
            array = np.split(array, doc["mesh"][axis], axis=dim)[place(doc, axis, rank)]
    size = layout["opt_weight_shard_size"]
    if size > 0:
        # the ranks holding this slice gather it in rank order: a rank holds the
        # chunk of its place among them (get_rank(group), parallel/_tensor.py
        # _load_tensor_by_layout)
        experts = "ep" in param["split"]
        unused = [a for a in ("dp", "tp") if a not in param["split"]]
        unused = ["edp" if a == "dp" and experts else a for a in unused]
        group = holders(doc, rank, tuple(unused))
        assert len(group) == size, (param["path"], group, size)
        array = np.split(array, size, axis=0)[group.index(rank)]
    return array


def write_run(tree: Path, run: Path, full: dict[str, np.ndarray]) -> None:
    import mindspore as ms

    doc = json.loads((tree / "plan.json").read_text())
    params = {p["path"]: p for p in every_param(doc)}
    for rank in range(doc["devices"]):
        stage = place(doc, "pp", rank)
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
            sliced = cut(value, params[path], layouts[path], rank, doc)
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


def moe_spec(folder: Path, capacity: float | None) -> Path:
    """tests/specs/tiny_moe.msl at dp 4, tp 2, ep 2, zero 1, with 8 experts of 8 x 128
    x 32 fp32 (128 KiB: past hsdp's threshold) and hidden 128: the parallel optimizer
    splits the embedding table (whole over tp) over all 8 ranks of the stage, the
    experts over the ranks holding the same ones: dropless (whole over tp) ranks 0, 1,
    4, 5 (not evenly spaced), with a capacity (ffn over tp) 0 and 4."""
    text = SPECS["tiny_moe"].read_text()
    text = text.replace("    tp = 2\n}", "    tp = 2\n    ep = 2\n}")
    text = text.replace("hidden   = 64", "hidden   = 128").replace("experts = 4", "experts = 8")
    text = text.replace("    seed         = 1234", "    seed         = 1234\n    zero = 1")
    if capacity:
        text = text.replace("aux_loss = 0.01", f"capacity = {capacity}, aux_loss = 0.01")
    spec = folder / "tiny_moe.msl"
    folder.mkdir(parents=True)
    spec.write_text(text)
    return spec


CASES = {
    "tiny_zero0": ("tiny", 0, None),
    "tiny_zero1": ("tiny", 1, None),
    "moe_dropless": ("tiny_moe", 1, None),
    "moe_capacity": ("tiny_moe", 1, 0.5),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_transform_checkpoints_merges_the_slices_into_the_full_tensors(case, tmp_path):
    name, zero, capacity = CASES[case]
    if name == "tiny":
        tree = compile_spec(SPECS["tiny"], tmp_path / "tree", "--set", f"train.zero={zero}")
    else:
        tree = compile_spec(moe_spec(tmp_path / "spec", capacity), tmp_path / "tree")
    sharded = [
        path
        for stage in tree.glob("strategy/stage_*.json")
        for path, layout in json.loads(stage.read_text())["parallel_layout_item"].items()
        if layout["opt_weight_shard_size"] > 0
    ]
    assert bool(sharded) == (zero > 0)  # the parallel optimizer's fields are exercised
    full = full_state(tree)
    write_run(tree, tmp_path / "run", full)
    merged = merge(tmp_path / "run", tmp_path / "out")
    for name, value in full.items():
        assert name in merged, name
        np.testing.assert_array_equal(merged[name], value, err_msg=name)


@pytest.mark.parametrize("capacity", [None, 0.5])
def test_msgens_own_cut_is_the_one_the_merge_reads(capacity, tmp_path):
    """msgen.ckpt.slices (what `ckpt from-hf` writes each rank) cuts every rank's slice
    of every parameter as `cut` above does, whose slices MindSpore merges back whole:
    the experts' parallel optimizer chunk by the rank's place among the ranks holding
    them (dropless: 0, 1, 4, 5, whose recorded stride 1 is no stride)."""
    from msgen.ckpt.slices import slice_of

    tree = compile_spec(moe_spec(tmp_path / "spec", capacity), tmp_path / "tree")
    doc = json.loads((tree / "plan.json").read_text())
    layouts = json.loads((tree / "strategy" / "stage_0.json").read_text())["parallel_layout_item"]
    rng = np.random.default_rng(0)
    for param in every_param(doc):
        value = rng.standard_normal(param["shape"]).astype(np.float32)
        layout = layouts[param["path"]]
        for rank in range(doc["devices"]):
            # a rank's place in its stage: the strategy file's device matrix is the stage's
            ours = slice_of(value, layout, rank % int(np.prod(layout["dev_matrix"])))
            np.testing.assert_array_equal(ours, cut(value, param, layout, rank, doc))
