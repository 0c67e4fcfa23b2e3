"""The file fuzzer (tests/file_mutations.py), a fixed sample per run (CI_SAMPLE),
each case in the guarded worker (tests/fuzz_guard.py) and meeting the spec fuzzer's
oracle (in time and memory, a documented exit status, no traceback). `make fuzz` runs the whole campaign over every
surface (bench/bench_fuzz.py --files). And the fuzzer and its guard themselves: the
sample reaches past the readers, a crash is found with its reproducer, a hang and
a memory hog are stopped."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections import Counter

import pytest

from msgen.hf import config
from tests.file_mutations import SEED_OF, SURFACES, WEIGHTS, run_case
from tests.file_seeds import Seeds
from tests.fuzz_guard import Guard
from tests.mutations import call

# The sample: cases 0 .. n - 1 of campaign 0 over each surface, about 215 cases at
# some 20 a second (the whole campaign measured 21 cases/s over 400 cases).
CI_SAMPLE = {
    "config": 80,
    "hf-config": 15,
    "safetensors": 20,
    "index": 20,
    "source": 15,
    "ranks": 10,
    "run.json": 20,
    "log.csv": 20,
    "calibration": 15,
}
SECONDS, MEMORY = 60, 2 << 30


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> Seeds:
    return Seeds(tmp_path_factory.mktemp("seeds"))


@pytest.fixture(scope="module")
def sample(seeds, tmp_path_factory):
    """(Case, exit status, stderr, what is wrong) of each case of the sample."""
    scratch = tmp_path_factory.mktemp("scratch")
    guard = Guard("tests.file_mutations:guarded_case", SECONDS, MEMORY)
    previous = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(scratch)  # the worker's scratch, removed with the test's
    try:
        results = []
        for surface, count in CI_SAMPLE.items():
            seeds.folder(SEED_OF[surface])
            for i in range(count):
                done, result = guard.run(str(seeds.root), 0, i, (surface,), None)
                results.append(result if done else (f"{surface} {i}", "killed", "", [result]))
    finally:
        guard.close()
        os.environ.pop("TMPDIR") if previous is None else os.environ.update(TMPDIR=previous)
    return results


def test_the_sample_meets_the_oracle(sample):
    failed = [(str(case), wrong, err[-600:]) for case, _, err, wrong in sample if wrong]
    assert failed == []


def test_the_config_sample_reaches_past_the_reader(sample):
    """Most mutated configs are refused (one line, exit 2), and enough are not that
    the spec writer and the planner see mutated configs too."""
    statuses = Counter(status for case, status, _, _ in sample if case.surface == "config")
    n = sum(statuses.values())
    assert statuses[2] >= 0.4 * n and statuses[0] + statuses[1] >= 0.1 * n, statuses


def test_every_surface_has_a_seed_and_a_weight():
    assert set(WEIGHTS) == set(SEED_OF) == set(SURFACES) and set(CI_SAMPLE) <= set(SURFACES)


# the fuzzer and its guard find what they say they do ----------------------------------


def test_a_crash_is_found_with_what_reproduces_it(seeds, monkeypatch, tmp_path):
    """A reader that raises (as config.json's did before its schema) is a crash, and
    the case's files are kept with what went wrong."""

    def unhashable(config, name="config.json"):
        return {[]: 1}

    monkeypatch.setattr(config, "model_of", unhashable)
    case, status, err, wrong = run_case(seeds, 0, 0, ("config",), keep=tmp_path)
    assert status == 70 and wrong == ["crashed"] and "TypeError: unhashable type" in err
    kept = tmp_path / "0"
    assert (kept / "config.json").is_file() and str(case) in (kept / "CASE.txt").read_text()
    assert str(case).startswith("case 0 (seed 0) config: config.json")


def hog(mib: int) -> int:
    """Take `mib` MiB, a MiB every 10 ms (written, so it is resident)."""
    held = []
    for _ in range(mib):
        held.append(b"\x01" * (1 << 20))
        time.sleep(0.01)
    return len(held)


def test_the_guard_stops_a_hang_a_memory_hog_and_a_dying_worker():
    guard = Guard("time:sleep", seconds=1, memory=MEMORY)
    began = time.monotonic()
    assert guard.run(30) == (False, "took more than 1 s")
    assert time.monotonic() - began < 10
    assert guard.run(0) == (True, None)  # a new worker takes the next case
    guard.close()
    guard = Guard("tests.test_fuzz_files:hog", seconds=60, memory=300 << 20)
    assert guard.run(5) == (True, 5)
    assert guard.run(4000) == (False, "grew past 0.292969 GiB")
    guard.close()
    guard = Guard("os:_exit", seconds=60, memory=MEMORY)
    assert guard.run(3) == (False, "the worker died (exit code 3)")
    guard.close()


# Cases of the whole campaign (seed, case; every surface) that were exit 70 or grew
# past the memory bound once: damaged strategy files through merge and reshard, a
# config.json of another model than its tensors through from-hf, a source.json config
# of 10^8 layers through to-hf. Each is refused now, naming the file.
FOUND = ((1, 2140), (1, 2424), (1, 3340), (1, 3432), (1, 3663), (2, 1975))


def test_the_cases_the_campaign_found_are_refused(seeds, tmp_path):
    guard = Guard("tests.file_mutations:guarded_case", SECONDS, MEMORY)
    for name in sorted({SEED_OF[s] for s in SURFACES}):
        seeds.folder(name)
    try:
        results = [guard.run(str(seeds.root), seed, i, SURFACES, None) for seed, i in FOUND]
    finally:
        guard.close()
    assert [r for done, r in results if not done] == []
    assert [(case, status, wrong) for _, (case, status, _, wrong) in results] == [
        (case, 2, []) for _, (case, *_) in results
    ]


def test_a_strategy_file_whose_tensor_map_outgrows_its_tensor_is_refused(seeds, tmp_path):
    """Case 4302 of seed 1 as the campaign found it (a tensor_map of 3 dims for qkv's 2
    in rank_1/strategy.json, then reshard): written out, since the seed's strategy files
    gained items (the fused kernels, the buffers) and the case's index now draws
    another edit."""
    work = tmp_path / "ranks"
    shutil.copytree(seeds.folder("ranks"), work, symlinks=True)
    strategy = work / "ranks" / "rank_1" / "strategy.json"
    doc = json.loads(strategy.read_text())
    doc["parallel_layout_item"]["decoder.1.qkv.weight"]["tensor_map"] = [-1, 0, 0]
    strategy.write_text(json.dumps(doc))
    argv = ["ckpt", "reshard", "tiny_tp.msl", "ranks", "--set", "mesh.tp=1", "--set", "mesh.dp=2"]
    with contextlib.chdir(work):
        status, err = call(argv + ["-o", "resharded"])
    assert status == 2, err
    assert (
        "rank_1/strategy.json: the mesh cannot hold the spec's tensor decoder.1.qkv.weight" in err
    )
    assert not (work / "resharded").exists()
