"""`msgen ckpt merge` and `msgen ckpt reshard` on the CPU, through MindSpore's own
transform_checkpoints.

Semi-auto parallel cannot run on the CPU, so a run's per-rank layout is written here as
train.py's save() writes it: each rank folder holds its slices of the weights and of
the optimizer moments in `step_<N>.ckpt` (with the `step` train.py appends) and the
strategy file `msgen compile` wrote for its stage as `strategy.json`. The oracle is the
full state the slices were cut from, and numpy's split along the dim the spec splits.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from msgen.ckpt.slices import slice_of
from msgen.cli import main
from tests.emit_fixtures import SPECS, compile_spec, copy_compiled, every_param
from tests.oracles import require

ms = require("mindspore")
SPEC = SPECS["tiny"]  # dp 2, tp 2, pp 2, zero 1: every axis and the parallel optimizer
TP4 = ("--set", "mesh.tp=4", "--set", "mesh.dp=1")  # the same 8 devices


def msgen(*args) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, err.getvalue()


def full_state(tree: Path, step: int) -> dict[str, np.ndarray]:
    """Random weights and moments of every parameter, and train.py's step counters."""
    doc = json.loads((tree / "plan.json").read_text())
    rng = np.random.default_rng(0)
    full = {"global_step": np.array([step], np.int32), "step": np.array(step, np.int64)}
    for p in every_param(doc):
        for prefix in ("", "adam_m.", "adam_v."):
            full[prefix + p["path"]] = rng.standard_normal(p["shape"]).astype(np.float32)
    return full


def write_run(tree: Path, run: Path, full: dict, step: int) -> None:
    """Each rank's slices of `full` as train.py lays out a run: rank = (stage * dp +
    dp_index) * tp + tp_index, a stage holding only its own parameters."""
    mesh = json.loads((tree / "plan.json").read_text())["mesh"]
    per_stage = mesh["dp"] * mesh["tp"]
    for rank in range(per_stage * mesh["pp"]):
        strategy = tree / "strategy" / f"stage_{rank // per_stage}.json"
        layouts = json.loads(strategy.read_text())["parallel_layout_item"]
        folder = run / f"rank_{rank}"
        folder.mkdir(parents=True)
        shutil.copy(strategy, folder / "strategy.json")
        state = [
            {"name": n, "data": ms.Tensor(np.ascontiguousarray(slice_of(v, layouts[n], rank % per_stage)))}
            for n, v in full.items()
            if n in layouts
        ]  # fmt: skip
        state.append({"name": "global_step", "data": ms.Tensor(full["global_step"])})
        ms.save_checkpoint(state, str(folder / f"step_{step:08d}.ckpt"), append_dict={"step": step})


def loaded(path: Path) -> dict[str, np.ndarray]:
    return {n: p.asnumpy() for n, p in ms.load_checkpoint(str(path)).items()}


@pytest.fixture(scope="module")
def tp2_run(tmp_path_factory):
    """(tree, run folder, full state) of a tiny run at step 5 on its dp 2 x tp 2 x pp 2
    mesh, which keeps steps 4 and 5 on every rank."""
    base = tmp_path_factory.mktemp("tp2")
    tree = compile_spec(SPEC, base / "tree")
    full = full_state(tree, 5)
    write_run(tree, base / "run", full, 5)
    write_run(tree, base / "older", {n: v * 0 for n, v in full.items()}, 4)
    for rank in (base / "older").iterdir():  # an older step, which must not be taken
        shutil.copy(rank / "step_00000004.ckpt", base / "run" / rank.name)
    return tree, base / "run", full


def test_merge_gives_every_full_tensor_of_the_newest_common_step(tp2_run, tmp_path):
    _, run, full = tp2_run
    code, err = msgen("ckpt", "merge", SPEC, run, "-o", tmp_path / "full.ckpt")
    assert code == 0, err
    merged = loaded(tmp_path / "full.ckpt")
    assert set(merged) == set(full)
    for name, value in full.items():
        np.testing.assert_array_equal(merged[name], value, err_msg=name)


def back_again(run: Path, out: Path) -> None:
    """`out`, resharded back to the spec's own mesh, holds every rank's file of `run`."""
    code, err = msgen("ckpt", "reshard", SPEC, out, "-o", out.with_name("back"))
    assert code == 0, err
    for rank in range(8):
        name = f"rank_{rank}/step_00000005.ckpt"
        original, back = loaded(run / name), loaded(out.with_name("back") / name)
        assert set(back) == set(original), rank
        for key, value in original.items():
            np.testing.assert_array_equal(back[key], value, err_msg=f"rank {rank} {key}")
        assert (out.with_name("back") / f"rank_{rank}" / "strategy.json").is_file()


def test_reshard_to_tp4_and_back_gives_the_original_slices(tp2_run, tmp_path):
    tree, run, full = tp2_run
    code, err = msgen("ckpt", "reshard", SPEC, run, "-o", tmp_path / "tp4", *TP4)
    assert code == 0, err
    # tp 4: the qkv weight [64, 192] split on its second dim (the case safetensors 0.8.0
    # gets wrong, upstream issue 825), each rank's quarter by numpy
    for rank in range(4):
        got = loaded(tmp_path / "tp4" / f"rank_{rank}" / "step_00000005.ckpt")
        for name in ("decoder.0.qkv.weight", "adam_v.decoder.0.qkv.weight"):
            np.testing.assert_array_equal(got[name], np.split(full[name], 4, axis=1)[rank])
        np.testing.assert_array_equal(got["emb.table"], np.split(full["emb.table"], 4)[rank])
        assert not any(n.startswith(("decoder.1.", "norm.")) for n in got)  # stage 1's
    back_again(run, tmp_path / "tp4")


def test_reshard_to_one_stage_and_back_gives_the_original_slices(tp2_run, tmp_path):
    """pp 2 -> pp 1 (dp 4 x tp 2, the parallel optimizer over 4 ranks) and back."""
    _, run, full = tp2_run
    sets = ("--set", "mesh.pp=1", "--set", "mesh.tp=2")
    code, err = msgen("ckpt", "reshard", SPEC, run, "-o", tmp_path / "pp1", *sets)
    assert code == 0, err
    # every rank holds both layers now; the up weight [64, 256]: tp halves its columns,
    # zero quarters the rows over the dp ranks (tp apart): rank 2 is dp 1, tp 0
    got = loaded(tmp_path / "pp1" / "rank_2" / "step_00000005.ckpt")
    assert "decoder.1.up.weight" in got and "decoder.0.up.weight" in got
    half = np.split(full["adam_m.decoder.1.up.weight"], 2, axis=1)[0]
    np.testing.assert_array_equal(got["adam_m.decoder.1.up.weight"], np.split(half, 4)[1])
    back_again(run, tmp_path / "pp1")


def test_reshard_to_a_data_parallel_mesh_gives_every_rank_the_whole_state(tp2_run, tmp_path):
    _, run, full = tp2_run
    sets = ("--set", "mesh.tp=1", "--set", "mesh.pp=1", "--set", "train.zero=0")
    code, err = msgen("ckpt", "reshard", SPEC, run, "-o", tmp_path / "dp8", *sets)
    assert code == 0, err
    for rank in range(8):
        folder = tmp_path / "dp8" / f"rank_{rank}"
        assert not (folder / "strategy.json").exists()  # data-parallel ranks write none
        got = loaded(folder / "step_00000005.ckpt")
        assert set(got) == set(full)
        for name, value in full.items():
            np.testing.assert_array_equal(got[name], value, err_msg=f"rank {rank} {name}")


def test_rank_folders_with_no_step_in_common_are_refused(tp2_run, tmp_path):
    _, run, _ = tp2_run
    shutil.copytree(run, tmp_path / "run")
    for old in (tmp_path / "run" / "rank_3").glob("step_*.ckpt"):
        old.rename(old.with_name("step_00000009.ckpt"))
    code, err = msgen("ckpt", "merge", SPEC, tmp_path / "run", "-o", tmp_path / "full.ckpt")
    assert code == 2 and err.count("\n") == 1, err
    assert "no step in common: rank_0 has 4, 5, rank_3 has 9" in err
    assert not (tmp_path / "full.ckpt").exists()


def test_a_checkpoint_of_another_spec_is_refused(tp2_run, tmp_path):
    _, run, _ = tp2_run
    other = SPECS["tiny_llama"]
    code, err = msgen("ckpt", "merge", other, run, "-o", tmp_path / "full.ckpt")
    assert code == 2 and "is not a parameter of the spec" in err and "Traceback" not in err
    code, err = msgen("ckpt", "reshard", SPEC, run, "-o", tmp_path / "r", "--set", "model.ffn=128")
    assert code == 2 and "is [" in err and "in the spec" in err, err
    assert not (tmp_path / "full.ckpt").exists() and not (tmp_path / "r").exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # no scratch left behind


def test_an_existing_output_is_kept_without_force(tp2_run, tmp_path):
    _, run, _ = tp2_run
    (tmp_path / "full.ckpt").write_text("mine")
    code, err = msgen("ckpt", "merge", SPEC, run, "-o", tmp_path / "full.ckpt")
    assert code == 2 and "--force" in err and (tmp_path / "full.ckpt").read_text() == "mine"


@pytest.mark.slow
def test_a_merged_run_resumes_standalone_with_the_original_loss(tmp_path):
    """A real run's step-2 checkpoint, cut into the tp 2 mesh's slices, resharded to
    tp 4 and merged to one rank: --resume --standalone to step 3 logs the loss the
    original checkpoint resumed gives."""
    tree = copy_compiled("tiny", tmp_path / "tree")

    def train(out: Path, *extra: str) -> subprocess.CompletedProcess:
        done = subprocess.run(
            [sys.executable, "train.py", "--standalone", "--synthetic", "--output", str(out),
             *extra],
            cwd=tree, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    train(tmp_path / "a", "--steps", "2")
    full = loaded(tmp_path / "a" / "rank_0" / "step_00000002.ckpt")
    write_run(tree, tmp_path / "run", full, 2)
    assert msgen("ckpt", "reshard", SPEC, tmp_path / "run", "-o", tmp_path / "tp4", *TP4)[0] == 0
    merged = tmp_path / "b" / "rank_0" / "step_00000002.ckpt"
    merged.parent.mkdir(parents=True)
    code, err = msgen("ckpt", "merge", SPEC, tmp_path / "tp4", "-o", merged)
    assert code == 0, err
    train(tmp_path / "a", "--steps", "3", "--resume")
    train(tmp_path / "b", "--steps", "3", "--resume")

    def last_loss(out: Path) -> str:
        rows = (out / "rank_0" / "log.csv").read_text().splitlines()
        header = rows[0].split(",")
        return rows[-1].split(",")[header.index("loss")]

    assert last_loss(tmp_path / "b") == last_loss(tmp_path / "a")
