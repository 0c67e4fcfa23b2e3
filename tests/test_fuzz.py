"""The mutation fuzzer (tests/mutations.py), a bounded number of cases per run
(bench/bench_fuzz.py and `make fuzz` run the campaign): mutated specs through
check, estimate, fmt --check and compile, and random --set what-ifs over every
mesh and batch key through estimate and compile, each meeting the oracle (in
time, a documented exit status, no traceback, generated Python that compiles and
shell that passes bash -n, fmt keeping the diagnostics). And the fuzzer itself:
most cases get past the parser, and some reach code generation."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tests import mutations
from tests.mutations import case, past_parsing, run


def campaign(seed: int, n: int) -> list[tuple[str, list[str], int, str, list[str]]]:
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        name, text, command = case(rnd)
        status, err, wrong = run(name, text, command)
        out.append((name, command, status, err, wrong))
    return out


@pytest.fixture(scope="module")
def cases():
    return [c for seed in range(4) for c in campaign(seed, 25)]


def test_fuzz_cases_meet_the_oracle(cases):
    failed = [(name, cmd[:8], wrong, err[-800:]) for name, cmd, _, err, wrong in cases if wrong]
    assert failed == []


def test_most_cases_reach_the_checks_and_some_the_code(cases):
    seen = Counter()
    for _, command, status, err, _ in cases:
        kind = "set" if "--set" in command else "mutated"
        seen[kind] += 1
        seen[kind, "past parsing"] += past_parsing(err)
        seen[kind, "clean"] += status == 0
        seen["compile"] += command[0] == "compile"
        seen["compile", "written"] += command[0] == "compile" and status == 0
    assert seen["mutated", "past parsing"] >= 0.6 * seen["mutated"], seen
    assert seen["set", "clean"] >= 0.25 * seen["set"], seen
    assert seen["compile", "written"] >= 0.1 * seen["compile"], seen


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4, 8))
def test_more_fuzz_cases_meet_the_oracle(seed):
    failed = [(n, c[:8], w, e[-800:]) for n, c, _, e, w in campaign(seed, 100) if w]
    assert failed == []


# the oracle catches what it says it does ---------------------------------------------


def test_the_oracle_finds_broken_generated_code(tmp_path):
    (tmp_path / "model.py").write_text("def f(:\n")
    (tmp_path / "run.sh").write_text("if then\n")
    (tmp_path / "ok.py").write_text("x = 1\n")
    found = mutations.generated_faults(tmp_path)
    assert [f.split(" ")[0] for f in found] == ["model.py", "run.sh"]


def test_the_oracle_finds_undocumented_exits_and_crashes():
    assert mutations.failures(["check"], 3, "") == ["exit status 3 is not documented for check"]
    assert mutations.failures(["fmt", "--check"], 3, "") == []
    assert mutations.failures(["estimate"], 70, "") == ["crashed"]
    assert mutations.failures(["compile"], 1, "Traceback (most recent call last)") == ["crashed"]


def test_the_oracle_finds_a_case_past_its_time(monkeypatch):
    monkeypatch.setattr(mutations, "TIME_LIMIT", 1)
    monkeypatch.setattr(mutations, "main", lambda argv: __import__("time").sleep(30))
    status, _, wrong = run("base.msl", mutations.SPECS["base.msl"], ["check"])
    assert wrong == ["took more than 1 s"]


def test_the_oracle_finds_fmt_changing_the_diagnostics(tmp_path, monkeypatch):
    path = tmp_path / "base.msl"
    path.write_text(mutations.SPECS["base.msl"])
    assert mutations.fmt_faults(path) == []
    monkeypatch.setattr(mutations, "format_text", lambda text, file: (text + "bogus\n", []))
    assert mutations.fmt_faults(path)[0].startswith("fmt changes the diagnostics")
