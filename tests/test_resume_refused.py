"""A `--resume` that train.py refuses once the step has compiled leaves the run folder as it
was, byte for byte: the project never overwrites a previous run without being told.

Whether a checkpoint fits is known only after the step compiles (under semi-auto parallel
the parameters take their slice shapes then), and compiling is when MindSpore writes the
strategy file (parallel/_utils.py `_init_auto_parallel_context` sets
strategy_ckpt_config's save_file for the compile) and when --rehearse writes
rehearsal.json. Both are written under a staged name and renamed only once the start is
accepted (settle_staged in train.py). The CPU build writes no strategy file in any way it
runs (tests/test_strategy_source.py), so the rehearsal's rehearsal.json, which goes the
same way, is what the real run here shows; the staged strategy name is held by
tests/test_parallel_audit.py's rule_strategy_file_per_rank.

Real train.py of specs/tiny.msl (pp = 2, rehearsed in one CPU process) on real MindSpore
(slow: the refusal comes only after the step has compiled).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.emit_fixtures import copy_compiled


def snapshot(folder: Path) -> dict[str, bytes | None]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() if p.is_file() else None
        for p in sorted(folder.rglob("*"))
    }


def previous_run(rank: Path, saved: dict[str, np.ndarray]) -> None:
    """A run folder of another spec or mesh: its checkpoint at step 2 holds `saved`, and the
    files a start writes (rehearsal.json, strategy.json, run.json) hold the previous run's."""
    import mindspore as ms

    rank.mkdir(parents=True)
    ms.save_checkpoint(
        [{"name": name, "data": ms.Tensor(value)} for name, value in saved.items()],
        str(rank / "step_00000002.ckpt"),
        append_dict={"step": 2},
    )
    (rank / "log.csv").write_text("step,loss,skipped\n1,5.5,0\n2,5.25,0\n")
    previous = {"cells": {"step": "previous"}, "parameters": {"w": [2, 2]}}
    (rank / "rehearsal.json").write_text(json.dumps(previous, indent=2) + "\n")
    (rank / "strategy.json").write_text('{"previous": "mesh"}\n')
    (rank / "run.json").write_text('{"segments": []}\n')


@pytest.mark.slow  # about 20 s of compiling tiny's pipeline on an idle CPU, 50 s shared
def test_a_refused_resume_leaves_the_run_folder_byte_identical(tmp_path):
    tree = copy_compiled("tiny", tmp_path / "tiny")
    output = tmp_path / "output"
    # Saved from another spec: none of tiny's parameters, so restore refuses it after the
    # step has compiled (and the rehearsal's cells are built).
    previous_run(output / "rank_0", {"w": np.ones((2, 2), np.float32)})
    before = snapshot(output)
    proc = subprocess.run(
        [sys.executable, "train.py", "--rehearse", "--synthetic", "--resume", "--steps", "4"]
        + ["--output", str(output)],
        cwd=tree,
        env={**os.environ, "GLOG_v": "3"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-4000:]
    err = proc.stderr.strip().splitlines()
    assert err[-1].startswith("train.py: error: --resume: ") and "lacks" in err[-1], err[-3:]
    assert "compiled" in proc.stdout, "refused before the step compiled: nothing shown"
    after = snapshot(output)
    assert after.keys() == before.keys(), sorted(after.keys() ^ before.keys())
    changed = [name for name in before if after[name] != before[name]]
    assert not changed, f"a refused --resume rewrote {changed}"
