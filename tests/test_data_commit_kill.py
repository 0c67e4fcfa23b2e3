"""`msgen data` killed (SIGKILL) while the finished dataset is moved into place: before
the first rename, after one, before dataset.json's and after it. A run killed there
never leaves a dataset.json that is not the whole, final one, and the same command
with `--resume` ends with the bytes of a run never killed (and no staging folder).

The kill comes from inside the run: msgen runs in a fresh interpreter whose
`os.replace` sends SIGKILL to its own process when the Nth rename into the output
folder is about to happen (the renames inside the staging folder pass), or, past the
last rename, when the staging folder is about to be removed; so the point is exact,
not a race against a timer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.data_fixtures import ROOT, chinese, english, msgen, write_jsonl
from tests.test_data_engines import files_of, spec_for, tokenizer_file

__all__ = ["tokenizer_file"]  # the fixture, shared

KILLED = -9

RUN_UNTIL_RENAME = r"""
import os, shutil, signal, sys
from pathlib import Path
from msgen.cli import main

folder = Path(sys.argv[1]).resolve()
kill_at = int(sys.argv[2])
real_replace, real_rmtree = os.replace, shutil.rmtree
renames = []

def replace(src, dst, *args, **kwargs):
    if Path(dst).resolve().parent == folder:  # into the output folder, not the staging
        if len(renames) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        renames.append(dst)
    return real_replace(src, dst, *args, **kwargs)

def rmtree(path, *args, **kwargs):
    if Path(path).name == ".msgen-data-partial" and renames and len(renames) == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    return real_rmtree(path, *args, **kwargs)

os.replace, shutil.rmtree = replace, rmtree
sys.exit(main(sys.argv[3:]))
"""


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory) -> Path:
    """8 files, one cut into 3 ranges: 10 units."""
    corpus = tmp_path_factory.mktemp("corpus")
    docs = english() + chinese()
    for i in range(7):
        write_jsonl(corpus / f"part-{i}.jsonl", docs[i * 5 : i * 5 + 5])
    write_jsonl(corpus / "zlarge.jsonl", docs[:60])
    return corpus


def killed_at(n: int, args: list, folder: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"}
    command = [sys.executable, "-c", RUN_UNTIL_RENAME, str(folder), str(n), *map(str, args)]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow  # a fresh interpreter (MindSpore's imports) a kill: 40 s and more
def test_a_kill_while_the_dataset_moves_into_place_resumes_to_the_same_bytes(
    tmp_path, small_corpus, tokenizer_file
):
    spec = spec_for(tmp_path)
    unit = str((small_corpus / "zlarge.jsonl").stat().st_size // 3 + 1)
    args = ["data", spec, small_corpus, "--tokenizer", tokenizer_file, "--unit-size", unit,
            "--workers", "1", "--valid", "0.2"]  # fmt: skip
    clean = tmp_path / "clean"
    status, _, err = msgen(*args, "-o", clean)
    assert status == 0, err
    manifest = (clean / "dataset.json").read_bytes()
    renames = len(files_of(clean))  # every file is renamed into place once, dataset.json last
    assert renames > 20
    for n in (0, 1, renames // 2, renames - 1, renames):  # renames: before the staging goes
        out = tmp_path / f"killed-{n}"
        proc = killed_at(n, [*args, "-o", out], out, Path.cwd())  # the manifest's paths
        assert proc.returncode == KILLED, (n, proc.returncode, proc.stderr[-2000:])
        moved = {p.name for p in out.iterdir() if p.is_file()}
        assert len(moved) == n
        # dataset.json is absent until it is the whole, final one (the last rename)
        if n == renames:
            assert (out / "dataset.json").read_bytes() == manifest
        else:
            assert "dataset.json" not in moved, n
        status, _, err = msgen(*args, "-o", out, "--resume")
        assert status == 0, (n, err)
        assert f"{10:,} units were done before (--resume)" in err, err
        assert (out / "dataset.json").read_bytes() == manifest
        assert json.loads(manifest)["files"]["valid"]
        assert files_of(out) == files_of(clean), n
        assert not list(out.glob(".msgen-data-*")), n
