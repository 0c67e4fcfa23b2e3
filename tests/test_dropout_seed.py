"""The seed covers dropout: two runs of a spec with dropout and one seed train alike.

ops.Dropout with both seeds 0 lets the kernel draw fresh seeds on every run
(common/seed.py, _get_graph_seed), so model.py gives each dropout primitive the global
seed and its place in the build order (dropout_seeds). tiny drops out after the
attention projection and the MLP of every layer.
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


@pytest.mark.slow
def test_two_runs_with_one_seed_have_the_same_losses(tmp_path):
    env = {**os.environ, "GLOG_v": "3"}
    folders = [copy_compiled("tiny", tmp_path / f"run{i}") for i in (1, 2)]
    procs = [
        subprocess.Popen(
            [sys.executable, "train.py", "--standalone", "--synthetic", "--steps", "3"],
            cwd=folder,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for folder in folders
    ]
    for proc in procs:
        out, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, out[-3000:]
    first, second = (losses(f) for f in folders)
    assert len(first) == 3 and first == second
