"""The mutation fuzzer, a bounded number of cases per run (bench/bench_fuzz.py runs
the campaign): mutated and hostile specs through check, estimate, fmt --check,
compile --check and --set never end in exit 70 or a traceback."""

from __future__ import annotations

import random

import pytest

from tests.mutations import case, crashed, run


@pytest.mark.parametrize("seed", range(4))
def test_fuzz_cases_never_crash(seed):
    rnd = random.Random(seed)
    for _ in range(25):
        name, text, command = case(rnd)
        status, err = run(name, text, command)
        assert not crashed(status, err), (name, command, text, err[-2000:])
