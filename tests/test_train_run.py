"""The generated train.py as a user meets it: it says at once what it will do, when the
graph compiles and for how long, and each evaluation; it never starts over a run
without being told; --resume passes over damaged checkpoints, saying so, and a run
never deletes a checkpoint it wrote. Real train.py of tests/specs/tiny_dp.msl,
stand-alone on real MindSpore, a few steps."""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.emit_fixtures import compiled
from tests.test_hostile_train import base_folder, run_train

pytestmark = pytest.mark.slow
STEPS = 4  # tiny_dp evaluates and checkpoints every 2 steps, keeping 3


def ckpt(step: int) -> str:
    return f"step_{step:08d}.ckpt"


def log_rows(folder: Path) -> list[dict[str, str]]:
    with (folder / "output" / "rank_0" / "log.csv").open() as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def first(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    folder = base_folder(tmp_path_factory.mktemp("train_run"))
    proc = run_train(folder, "--standalone", "--steps", str(STEPS))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return folder, proc


def test_it_talks(first):
    folder, proc = first
    lines = proc.stdout.splitlines()
    assert lines[0] == (
        f"train.py: training tiny_dp to step {STEPS} on train.mindrecord; world size 1 "
        "(--standalone: the dp 2 x tp 1 x pp 1 mesh in one process); "
        f"writing {folder / 'output' / 'rank_0'}"
    )
    first_step = [i for i, line in enumerate(lines) if line.startswith("step 1/4: loss")]
    compiling = lines.index("compiling the step graph (the first run takes longest) ...")
    (compiled_line,) = [line for line in lines if line.startswith("compiled in ")]
    assert re.fullmatch(r"compiled in \d+\.\d s", compiled_line)
    assert 0 < compiling < lines.index(compiled_line) < first_step[0]
    evaluations = [line for line in lines if "evaluat" in line or "valid loss" in line]
    assert [line.split(" ...")[0] for line in evaluations[::2]] == [
        "step 2/4 (50%): evaluating on valid.mindrecord",
        "step 4/4 (100%): evaluating on valid.mindrecord",
    ]
    for line in evaluations[1::2]:
        assert re.fullmatch(
            r"step [24]: valid loss \d\.\d{4}, perplexity [\d.]+ \(\d+\.\d s\)", line
        )


def run_again(
    first, tmp_path: Path, *args: str, damage=None
) -> tuple[Path, subprocess.CompletedProcess]:
    folder = tmp_path / "again"
    shutil.copytree(first[0], folder)
    if damage:
        damage(folder / "output" / "rank_0")
    return folder, run_train(folder, "--standalone", *args)


@pytest.fixture(scope="module")
def again(first, tmp_path_factory) -> dict:
    """The first run's folder, copied, run again: resumed past damaged checkpoints, and
    overwritten (side by side)."""

    def damage(rank: Path) -> None:
        whole = (rank / ckpt(4)).read_bytes()
        (rank / ckpt(4)).write_bytes(whole[: len(whole) // 2])
        (rank / ckpt(6)).write_text("garbage\n")
        (rank / ckpt(8)).write_bytes(b"")

    jobs = {
        "resumed": (("--resume", "--steps", "3"), damage),
        "overwritten": (("--overwrite", "--steps", "2"), None),
    }

    def one(name):
        args, hurt = jobs[name]
        return name, run_again(first, tmp_path_factory.mktemp(name), *args, damage=hurt)

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(one, jobs))


def test_resume_passes_over_damaged_checkpoints_and_keeps_what_it_wrote(first, again):
    folder, proc = again["resumed"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (
        f"--resume: {ckpt(8)} is damaged (MindSpore cannot read it); {ckpt(6)} is damaged "
        f"(MindSpore cannot read it); {ckpt(4)} is damaged (MindSpore cannot read it): "
        f"resuming from {ckpt(2)} instead"
    ) in proc.stdout.splitlines()
    assert "rank 0: steps 2 -> 3," in proc.stdout
    rows = log_rows(folder)
    assert [r["step"] for r in rows] == ["1", "2", "3"]
    assert rows[:2] == log_rows(first[0])[:2]
    rank = folder / "output" / "rank_0"
    # The checkpoint it just wrote stays, and so does its own line's step 2 (keep 3);
    # the files it passed over are no part of this run and are left as they were.
    assert sorted(p.name for p in rank.glob("*.ckpt")) == [ckpt(s) for s in (2, 3, 4, 6, 8)]
    assert (rank / ckpt(6)).read_text() == "garbage\n" and (rank / ckpt(8)).read_bytes() == b""


def test_overwrite_starts_anew_and_says_what_it_removes(first, again):
    folder, proc = again["overwritten"]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rank = folder / "output" / "rank_0"
    assert (
        f"rank 0: --overwrite: removing 3 files of the run in {Path('output') / 'rank_0'}: "
        f"log.csv, {ckpt(2)}, {ckpt(4)}"
    ) in proc.stdout.splitlines()
    assert [r["step"] for r in log_rows(folder)] == ["1", "2"]
    assert sorted(p.name for p in rank.glob("*.ckpt")) == [ckpt(2)]


FAKE_MSRUN = """#!/usr/bin/env bash
echo "GLOG_v=${GLOG_v-unset}"
"""


@pytest.mark.parametrize("given, seen", [(None, "3"), ("2", "2")])
def test_launch_script_quiets_mindspore_unless_asked(tmp_path, given, seen):
    """launch/msrun.sh sets MindSpore's log level (GLOG_v, read by mindspore/log.py and
    its C++ logging) to errors only; a GLOG_v the user sets wins."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "msrun").write_text(FAKE_MSRUN)
    (bin_dir / "msrun").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "GLOG_v"}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    if given:
        env["GLOG_v"] = given
    script = compiled("tiny_dp") / "launch" / "msrun.sh"
    done = subprocess.run(
        ["bash", str(script), "0"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"GLOG_v={seen}"]
