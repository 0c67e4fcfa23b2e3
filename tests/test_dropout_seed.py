"""The seed covers dropout: two runs of a spec with dropout and one seed train alike, and
a run stopped and resumed trains bit for bit as the uninterrupted one.

ops.Dropout with both seeds 0 lets the kernel draw fresh seeds on every run
(common/seed.py, _get_graph_seed), so model.py gives each dropout primitive the global
seed and its place in the build order (dropout_seeds). The CPU kernel keeps its
generator inside itself, so a resumed run reseeds each primitive to start where the
uninterrupted run's kernels stood (train.py's continue_dropout). tiny drops out after
the attention projection and the MLP of every layer.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest

from tests.emit_fixtures import copy_compiled


def losses(folder) -> list[str]:
    with (folder / "output" / "rank_0" / "log.csv").open() as f:
        return [row["loss"] for row in csv.DictReader(f)]


def train(folder, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "train.py", "--standalone", "--synthetic", *args],
        cwd=folder,
        env={**os.environ, "GLOG_v": "3"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    return out


@pytest.mark.slow
def test_two_runs_with_one_seed_have_the_same_losses(tmp_path):
    folders = [copy_compiled("tiny", tmp_path / f"run{i}") for i in (1, 2)]
    for proc in [train(folder, "--steps", "3") for folder in folders]:
        finish(proc)
    first, second = (losses(f) for f in folders)
    assert len(first) == 3 and first == second


@pytest.mark.slow
def test_a_resumed_run_drops_out_as_the_uninterrupted_one(tmp_path):
    import mindspore as ms
    import numpy as np

    straight, stopped = (copy_compiled("tiny", tmp_path / name) for name in ("straight", "stopped"))
    whole = train(straight, "--steps", "4")
    finish(train(stopped, "--steps", "2"))
    out = finish(train(stopped, "--steps", "4", "--resume"))
    finish(whole)
    assert "steps 2 -> 4" in out
    assert losses(stopped) == losses(straight)
    last = "output/rank_0/step_00000004.ckpt"
    ours = ms.load_checkpoint(str(stopped / last))
    theirs = ms.load_checkpoint(str(straight / last))
    assert ours.keys() == theirs.keys()
    for name, value in theirs.items():
        assert np.array_equal(ours[name].asnumpy(), value.asnumpy()), name
