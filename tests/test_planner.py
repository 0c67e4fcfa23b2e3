"""`msgen plan`: the plans pass every check and compile, `estimate` with a plan's
`--set` flags reports the plan's own step time, and the top plan is never
predicted slower than the spec as written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from msgen.cli import main

ROOT = Path(__file__).resolve().parent.parent


def run_json(capsys, *argv):
    code = main(list(argv))
    return code, json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def searches():
    import contextlib
    import io

    out = {}
    for name in ("gpt7b.msl", "llama13b.msl"):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = main(["plan", str(ROOT / "specs" / name), "--json", "--top", "3"])
        out[name] = (code, json.loads(buf.getvalue()))
    return out


@pytest.mark.parametrize("name", ["gpt7b.msl", "llama13b.msl"])
def test_top_three_are_distinct_compile_and_match_estimate(name, searches, capsys, tmp_path):
    code, doc = searches[name]
    assert code == 0
    plans = doc["plans"]
    assert len(plans) == 3
    assert len({frozenset(p["set"]) for p in plans}) == 3
    spec = str(ROOT / "specs" / name)
    for p in plans:
        sets = [a for s in p["set"] for a in ("--set", s)]
        # the same flags in another order mean the same spec
        backwards = [a for s in reversed(p["set"]) for a in ("--set", s)]
        code, est = run_json(capsys, "estimate", spec, "--json", *backwards)
        assert code == 0 and est["fits"]
        assert est["time"]["step_s"] == p["step_s"]
        assert max(s["total_bytes"] for s in est["stages"]) == p["peak_bytes"]
        assert main(["compile", spec, "-o", str(tmp_path / str(p["rank"])), *sets]) == 0
    steps = [p["step_s"] for p in plans]
    assert steps == sorted(steps)


@pytest.mark.parametrize("name", ["gpt7b.msl", "llama13b.msl"])
def test_top_plan_beats_the_spec_that_recomputes_with_memory_to_spare(name, searches):
    _, doc = searches[name]
    spec, top = doc["spec"], doc["plans"][0]
    assert top["step_s"] <= spec["step_s"]
    # both specs recompute every layer in full and leave memory to spare
    assert spec["fits"] and "recompute.decoder=full" in spec["set"]
    assert top["step_s"] < spec["step_s"]


def test_objective_memory_ranks_by_peak(capsys):
    code, doc = run_json(capsys, "plan", str(ROOT / "specs" / "tiny.msl"), "--json",
                         "--objective", "memory")  # fmt: skip
    assert code == 0
    peaks = [p["peak_bytes"] for p in doc["plans"]]
    assert peaks == sorted(peaks)


def test_nothing_fits_says_what_would(capsys, tmp_path):
    text = (ROOT / "specs" / "validation" / "korthikanti22b.msl").read_text()
    path = tmp_path / "small.msl"
    path.write_text(
        text.replace("pipeline {", "budget {\n    device_memory = 4 GiB\n}\n\npipeline {")
    )
    code = main(["plan", str(path)])
    out = capsys.readouterr().out
    assert code == 1
    assert "nothing fits the budget" in out and "more devices" in out


def test_write_saves_the_picked_plan_as_a_formatted_spec(searches, capsys, tmp_path):
    """`--write FILE --pick N`: the spec with plan N's settings in it, laid out as fmt
    does, comments kept; its estimate is plan N's; an existing FILE needs --force."""
    import shutil

    from msgen.syntax.fmt import format_text

    spec = tmp_path / "gpt7b.msl"
    shutil.copy(ROOT / "specs" / "gpt7b.msl", spec)
    shutil.copy(ROOT / "specs" / "hccn.conf", tmp_path)
    out = tmp_path / "planned.msl"
    _, doc = searches["gpt7b.msl"]
    assert main(["plan", str(spec), "--top", "3", "--write", str(out), "--pick", "2"]) == 0
    text = out.read_text()
    assert format_text(text, str(out))[0] == text  # fmt's layout
    assert "# data parallel" in text and "# pipeline stages" in text  # comments kept
    capsys.readouterr()
    code, est = run_json(capsys, "estimate", str(out), "--json")
    assert code == 0 and est["time"]["step_s"] == doc["plans"][1]["step_s"]
    written = text
    assert main(["plan", str(spec), "--top", "1", "--write", str(out)]) == 2
    assert "add --force" in capsys.readouterr().err and out.read_text() == written
    assert main(["plan", str(spec), "--top", "1", "--write", str(out), "--force"]) == 0
    capsys.readouterr()
    code, est = run_json(capsys, "estimate", str(out), "--json")
    assert est["time"]["step_s"] == doc["plans"][0]["step_s"]
    before = spec.read_text()
    assert main(["plan", str(spec), "--top", "1", "--write", str(spec), "--force"]) == 2
    assert "the spec itself" in capsys.readouterr().err and spec.read_text() == before


def test_settings_are_written_where_they_stand():
    from msgen.syntax.edit import write_settings

    text = "mesh {\n    dp = 4   # replicas\n}\n\ntrain {\n    zero = 1\n}\n"
    out = write_settings(text, ["mesh.dp=8", "mesh.pp=2", "train.zero=2", "recompute.d=full"])
    assert out == (
        "mesh {\n    dp = 8   # replicas\n\n    pp = 2\n}\n\ntrain {\n    zero = 2\n}\n"
        "\nrecompute {\n    d = full\n}\n"
    )
