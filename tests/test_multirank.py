"""A data-parallel mesh trained as real processes: the compiled tree's own launch/msrun.sh
starts two CPU workers (MindSpore's CPU build runs data-parallel mode under msrun; it
refuses semi-auto parallel, see test_parallel_audit.py for what runs there).

tests/specs/tiny_dp.msl (dp = 2, micro_batches 2, full recompute, dynamic loss scale,
no dropout) is trained STEPS steps under msrun on synthetic data and on a small
MindRecord, and stand-alone on the same global batches. Then:
- each rank reads its own half of every step's sequences, which together are the
  stand-alone step's;
- after the run both ranks' weights are bit-identical, moved from their initial values,
  and equal the stand-alone run's within 1e-4, and so do the losses and the gradient
  norms each rank logs;
- the validation loss every 2 steps is the stand-alone run's on both ranks;
- `--resume` on every rank from the middle checkpoint continues exactly.
The same holds on synthetic data for a second tree of the spec with selective
recompute (a cell, attention, and a primitive, gelu) and a fixed loss scale.
"""

from __future__ import annotations

import csv
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.emit_fixtures import SPECS, compile_spec, load

# About 100 s of two msrun workers and a stand-alone run: with the other msrun runs
# (MLA, MTP, the bias update) in `slow`, which CI runs after `make test`.
pytestmark = pytest.mark.slow

STEPS, RESUME_FROM = 4, 2  # tiny_dp checkpoints every 2 steps
SELECT = ("--set", "recompute.decoder=select(att, act)", "--set", "train.loss_scale=1024")
DATA_ROWS, VALID_ROWS = 24, 20  # valid: 2 whole steps of 8 (the rest is not read)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment() -> dict[str, str]:
    # No compile cache: a data-parallel graph loaded from it computed other gradients.
    bin_dir = str(Path(sys.executable).parent)  # msrun and python of this environment
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "GLOG_v": "3"}


def msrun(folder: Path, cwd: Path, output: Path, *args: str) -> subprocess.Popen:
    """launch/msrun.sh 0 from `cwd` (its logs go to cwd/output/msrun_log) on this host
    and a free port, as a user would run it; two runs side by side do not collide."""
    env = {**environment(), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    cmd = ["bash", str(folder / "launch" / "msrun.sh"), "0", "--output", str(output), *args]
    return subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def finish(proc: subprocess.Popen, cwd: Path) -> None:
    out, _ = proc.communicate(timeout=600)
    logs = "".join(
        f"--- {log.name}\n{log.read_text()[-3000:]}"
        for log in sorted((cwd / "output" / "msrun_log").glob("worker_*.log"))
    )
    assert proc.returncode == 0, f"{' '.join(proc.args)} failed:\n{out[-2000:]}{logs}"


def standalone(folder: Path, output: str, *args: str) -> subprocess.Popen:
    """train.py --standalone, its output in folder/output."""
    cmd = [sys.executable, "train.py", "--standalone", "--output", output, *args]
    return subprocess.Popen(
        cmd,
        cwd=folder,
        env=environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def log_rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def checkpoint(path: Path) -> dict[str, np.ndarray]:
    import mindspore as ms

    return {name: p.asnumpy() for name, p in ms.load_checkpoint(str(path)).items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """One folder with the compiled tree, its MindRecord, and these outputs (each with
    rank_<r>/): msrun_synthetic, msrun_data, alone_synthetic, alone_data, resumed; and
    in its folder `select`, the SELECT tree with msrun_synthetic and alone_synthetic."""
    from mindspore.mindrecord import FileWriter

    root = tmp_path_factory.mktemp("multirank")
    folder = compile_spec(SPECS["tiny_dp"], root / "out")
    select = compile_spec(SPECS["tiny_dp"], root / "select", *SELECT)
    shutil.move(select, folder / "select")
    select = folder / "select"
    rng = np.random.default_rng(7)
    for name, count in (("train", DATA_ROWS), ("valid", VALID_ROWS)):
        writer = FileWriter(str(folder / f"{name}.mindrecord"), shard_num=1)
        writer.add_schema({"input_ids": {"type": "int32", "shape": [-1]}}, "tokens")
        writer.write_raw_data(
            [{"input_ids": r} for r in rng.integers(0, 256, (count, 33), np.int32)]
        )
        writer.commit()

    steps = ("--steps", str(STEPS))
    # All at once (the CPU is idle for much of an msrun start); the synthetic run from
    # a folder of its own, so that the two msrun logs do not mix.
    synthetic = folder / "synthetic_cwd"
    synthetic.mkdir()
    started = [
        (standalone(folder, "alone_synthetic", "--synthetic", *steps), folder),
        (standalone(folder, "alone_data", *steps), folder),
        (msrun(folder, synthetic, folder / "msrun_synthetic", "--synthetic", *steps), synthetic),
        (msrun(folder, folder, folder / "msrun_data", *steps), folder),
        (standalone(select, "alone_synthetic", "--synthetic", *steps), select),
        (msrun(select, select, select / "msrun_synthetic", "--synthetic", *steps), select),
    ]
    for proc, cwd in started:
        finish(proc, cwd)
    # As if the data run had died after its checkpoint at RESUME_FROM.
    shutil.copytree(folder / "msrun_data", folder / "resumed")
    for rank in (0, 1):
        (folder / "resumed" / f"rank_{rank}" / f"step_{STEPS:08d}.ckpt").unlink()
    finish(msrun(folder, folder, folder / "resumed", "--resume", *steps), folder)
    return folder


@pytest.mark.parametrize("data", ["synthetic", "data"])
def test_ranks_train_as_one_standalone_run(runs, data):
    assert_ranks_train_as_one(runs, data)


def test_selective_recompute_and_a_fixed_scale_train_as_one_standalone_run(runs):
    select = runs / "select"
    assert "recompute(output_recompute=True)" in (select / "model.py").read_text()
    assert "LOSS_SCALE = 1024.0" in (select / "train.py").read_text()
    assert "self.att.recompute()" in (select / "model.py").read_text()
    assert_ranks_train_as_one(select, "synthetic")
    for rank in (0, 1):
        log = log_rows(select / "msrun_synthetic" / f"rank_{rank}" / "log.csv")
        assert {float(r["loss_scale"]) for r in log} == {1024.0}


def assert_ranks_train_as_one(runs: Path, data: str) -> None:
    import mindspore as ms

    ranks = [
        checkpoint(runs / f"msrun_{data}" / f"rank_{r}" / f"step_{STEPS:08d}.ckpt") for r in (0, 1)
    ]
    alone = checkpoint(runs / f"alone_{data}" / "rank_0" / f"step_{STEPS:08d}.ckpt")
    assert set(ranks[0]) == set(ranks[1]) == set(alone)
    for name in ranks[0]:
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name], err_msg=name)
        np.testing.assert_allclose(ranks[0][name], alone[name], atol=1e-4, err_msg=name)

    train = load(runs, "train")
    model = load(runs, "model")
    ms.set_seed(train.SEED)
    initial = {p.name: p.asnumpy() for p in model.TinyDp().get_parameters()}
    assert set(initial) <= set(ranks[0])
    moved = [name for name in initial if not np.allclose(initial[name], ranks[0][name])]
    assert len(moved) == len(initial), sorted(set(initial) - set(moved))

    alone_log = log_rows(runs / f"alone_{data}" / "rank_0" / "log.csv")
    for rank in (0, 1):
        log = log_rows(runs / f"msrun_{data}" / f"rank_{rank}" / "log.csv")
        assert [int(r["step"]) for r in log] == list(range(1, STEPS + 1))
        for mine, theirs in zip(log, alone_log, strict=True):
            for key in ("loss", "grad_norm", "lr", "loss_scale"):
                assert float(mine[key]) == pytest.approx(float(theirs[key]), abs=1e-4), key
            assert mine["skipped"] == "0"
            # The validation loss (tiny_dp evaluates every 2 steps), reduced over the ranks.
            assert bool(mine["valid_loss"]) == (data == "data" and int(mine["step"]) % 2 == 0)
            if mine["valid_loss"]:
                assert float(mine["valid_loss"]) == pytest.approx(
                    float(theirs["valid_loss"]), abs=1e-4
                )
    losses = [float(r["loss"]) for r in alone_log]
    assert losses[-1] < losses[0]


def test_each_rank_reads_its_half_of_the_steps_sequences(runs):
    train = load(runs, "train")
    train.DATA = str(runs / "train.mindrecord")
    for batches in (train.synthetic_batches, train.mindrecord_batches):
        for start in (0, 2, 5):  # 5: past the first epoch of 24 // 8 = 3 steps
            whole, _ = next(batches(1, 0, start))
            halves = [next(batches(2, shard, start))[0] for shard in (0, 1)]
            assert all(h.shape == (train.STEP_ROWS // 2, train.SEQ) for h in halves)
            np.testing.assert_array_equal(np.concatenate(halves), whole)
            assert not {tuple(r) for r in halves[0]} & {tuple(r) for r in halves[1]}


def test_resume_on_every_rank_continues_exactly(runs):
    for rank in (0, 1):
        resumed = runs / "resumed" / f"rank_{rank}"
        whole = runs / "msrun_data" / f"rank_{rank}"
        rows, expected = log_rows(resumed / "log.csv"), log_rows(whole / "log.csv")
        assert [int(r["step"]) for r in rows] == list(range(1, STEPS + 1))
        keys = ("step", "loss", "lr", "grad_norm", "loss_scale", "skipped", "valid_loss")
        assert [[r[k] for k in keys] for r in rows] == [[r[k] for k in keys] for r in expected]
        last = f"step_{STEPS:08d}.ckpt"
        got, want = checkpoint(resumed / last), checkpoint(whole / last)
        assert set(got) == set(want)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
