"""A worker's memory, as docs/data.md bounds it: its peak resident memory above what
it held when it started (msgen's imports, inherited by the fork) is at most
WORKER_BOUND plus the MindRecord index of what it wrote (INDEX_BYTES a window), and
does not grow with the size of the file its units come from.

Measured in each worker: `VmRSS` of /proc/self/status when the worker starts, and
`VmHWM` (its peak) after each unit. Both corpora are the same 2 MB of text spread
through blank lines (which the reader passes without parsing): 32 MB of them in the
small one, 320 MB in the large one. So a worker that held a whole file (reading it
to find its range) would pass WORKER_BOUND, at the cost of reading 320 MB, not of
tokenizing it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.data_fixtures import ROOT, chinese, english, write_jsonl
from tests.test_data_engines import spec_for, tokenizer_file

__all__ = ["tokenizer_file"]  # the fixture, shared

UNIT = 16 << 20
BLANK = b" " * ((1 << 20) - 1) + b"\n"

MEASURED = r"""
import json, os, sys
from pathlib import Path
from msgen.cli import main
from msgen.data import engines

def status(field):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) << 10

log, args = sys.argv[1], sys.argv[2:]
init_worker, call = engines.init_worker, engines.call

def measured_init(*a, **k):  # in the worker, before anything of its own
    engines.STATE["started"] = status("VmRSS")
    return init_worker(*a, **k)

def measured_call(*a, **k):
    try:
        return call(*a, **k)
    finally:
        with open(log, "a") as f:
            f.write(json.dumps([os.getpid(), engines.STATE["started"], status("VmHWM")]) + "\n")

engines.init_worker, engines.call = measured_init, measured_call
sys.exit(main(args))
"""


def padded(path: Path, lines: list[bytes], padding: int) -> Path:
    """`lines` with `padding` bytes of blank lines spread between them."""
    every = max(1, len(lines) * len(BLANK) // padding)
    with path.open("wb") as f:
        for i, line in enumerate(lines):
            f.write(line)
            if i % every == 0:
                f.write(BLANK)
    return path


def growth(tmp_path: Path, spec: Path, corpus: Path, tokenizer: Path, out: str) -> tuple[int, int]:
    """The largest growth of a worker above its start (bytes), and the dataset's windows:
    msgen in a fresh interpreter, on 2 workers forked from it."""
    log = tmp_path / f"{out}.log"
    args = ["data", spec, corpus, "--tokenizer", tokenizer, "-o", tmp_path / out,
            "--workers", "2", "--unit-size", str(UNIT)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"}
    proc = subprocess.run([sys.executable, "-c", MEASURED, str(log), *map(str, args)],
                          cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len({pid for pid, _, _ in rows}) == 2  # both workers took units
    windows = json.loads((tmp_path / out / "dataset.json").read_text())["counts"]["train"]
    return max(peak - started for _, started, peak in rows), windows["windows"]


@pytest.mark.slow
def test_worker_memory_is_bounded_by_its_units_not_its_file(tmp_path, tokenizer_file):
    from msgen.data.engines import INDEX_BYTES, WORKER_BOUND

    spec = spec_for(tmp_path)
    docs = english() + chinese()
    lines = write_jsonl(tmp_path / "text.jsonl", docs * 4).read_bytes().splitlines(True)
    small = padded(tmp_path / "small.jsonl", lines, 32 << 20)
    large = padded(tmp_path / "large.jsonl", lines, 320 << 20)
    first, windows = growth(tmp_path, spec, small, tokenizer_file, "small")
    second, _ = growth(tmp_path, spec, large, tokenizer_file, "large")
    bound = WORKER_BOUND + INDEX_BYTES * windows  # no unit writes more than all windows
    assert large.stat().st_size > bound  # a worker that held its file would pass it
    assert first < bound and second < bound, (first, second, bound)
    assert second - first < 64 << 20, (first, second)
