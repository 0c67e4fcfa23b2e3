"""`msgen report` on runs that are not whole: a row cut short, a malformed row, ranks
at different steps, no run.json, a rank missing; and on what is no run at all. Each
is said in a note (the report goes on) or is a usage error (exit 2, one line). The
published JSON schema is the report's. Alarm rules that need no real run: validation
rising, and a straggler against the other ranks' median. No MindSpore here: the logs
are written as train.py writes them (tests/test_run_report.py reads real ones)."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from msgen.cli import main
from msgen.runs.alarms import Thresholds
from msgen.runs.output import RunReport
from tests.oracles import require

HEADER = (
    "step,loss,perplexity,lr,grad_norm,loss_scale,skipped,tokens_per_s,step_time,mfu,"
    "valid_loss,valid_perplexity,peak_memory_bytes\n"
)
SCHEMA = Path(__file__).resolve().parents[1] / "docs" / "report.schema.json"


def row(step: int) -> str:
    loss = 5.0 - 0.01 * step
    return f"{step},{loss:.6g},1,0.001,1.5,65536,0,2000,0.128,1e-05,,,\n"


def report(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(["report", *map(str, argv)])
    return status, out.getvalue(), err.getvalue()


def lay_out(root: Path, logs: dict[int, str], world: int | None = None) -> Path:
    for rank, text in logs.items():
        folder = root / f"rank_{rank}"
        folder.mkdir(parents=True)
        (folder / "log.csv").write_text(text)
        if world is not None:
            segment = {"rank": rank, "world": world, "start_step": 0, "versions": {}}
            (folder / "run.json").write_text(json.dumps({"segments": [segment]}))
    return root


def notes(run: Path) -> tuple[list[str], dict]:
    status, out, err = report(run, "--json")
    assert status == 0, err
    doc = json.loads(out)
    return doc["notes"], doc


def test_a_last_row_cut_short_is_left_out_and_said(tmp_path):
    text = HEADER + "".join(row(s) for s in range(1, 31)) + "31,4.69,1,0.0"
    found, doc = notes(lay_out(tmp_path, {0: text}, world=1))
    assert found == ["rank 0: the last row is cut short (ignored)"]
    assert doc["summary"]["steps"] == 30 and doc["summary"]["loss"] == pytest.approx(4.7)


def test_a_malformed_row_is_left_out_and_said(tmp_path):
    rows = [row(s) for s in range(1, 31)]
    rows[9] = "10,4.9,1\n"  # too few fields
    rows[19] = "20,x,1,0.001,1.5,65536,0,2000,0.128,1e-05,,,\n"  # not a number
    found, doc = notes(lay_out(tmp_path, {0: HEADER + "".join(rows)}, world=1))
    assert found == ["rank 0: line 11 is malformed (ignored)",
                     "rank 0: line 21 is malformed (ignored)"]  # fmt: skip
    assert doc["ranks"][0]["rows"] == 28


def test_ranks_at_different_steps_no_run_json_and_a_missing_rank_are_said(tmp_path):
    logs = {0: HEADER + "".join(row(s) for s in range(1, 31)),
            1: HEADER + "".join(row(s) for s in range(1, 28))}  # fmt: skip
    run = lay_out(tmp_path, logs, world=3)
    (run / "rank_1" / "run.json").unlink()
    found, doc = notes(run)
    assert found == [
        "rank 1: no run.json (its versions cannot be checked)",
        "no log from rank 2",
        "ranks stopped at different steps: rank 0 at 30, rank 1 at 27",
    ]
    assert doc["world"] == 3 and [r["last_step"] for r in doc["ranks"]] == [30, 27]
    assert [r["run_json"] for r in doc["ranks"]] == [True, False]


def test_a_log_of_the_pipeline_stages_without_loss_reads_the_last_stage(tmp_path):
    """Only the last stage logs the loss: the summary reads the lowest rank that does."""
    no_loss = "".join(f"{s},,,0.001,1.5,65536,0,2000,0.128,1e-05,,,\n" for s in range(1, 31))
    logs = {0: HEADER + no_loss, 1: HEADER + "".join(row(s) for s in range(1, 31))}
    _, doc = notes(lay_out(tmp_path, logs, world=2))
    assert doc["summary"]["rank"] == 1 and doc["summary"]["loss"] == pytest.approx(4.7)


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda root: root / "absent", "no such folder"),
        (lambda root: root, "holds no rank_*/log.csv"),
        (lambda root: lay_out(root, {0: "a,b\n1,2\n"}), "holds no rank_*/log.csv"),
    ],
    ids=["no folder", "empty folder", "not train.py's log"],
)
def test_what_is_no_run_is_a_usage_error(tmp_path, setup, message):
    status, out, err = report(setup(tmp_path))
    assert status == 2 and out == ""
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_html_and_svg_are_one_or_the_other(tmp_path):
    run = lay_out(tmp_path / "run", {0: HEADER + row(1)})
    err = io.StringIO()
    with redirect_stderr(err), pytest.raises(SystemExit) as exited:
        main(["report", str(run), "--html", str(tmp_path / "a.html"), "--svg", "a.svg"])
    assert exited.value.code == 2 and "not allowed with" in err.getvalue()


def test_a_spec_with_errors_is_a_usage_error(tmp_path):
    run = lay_out(tmp_path / "run", {0: HEADER + row(1)})
    bad = tmp_path / "bad.msl"
    bad.write_text("msl 0.1\nmodel x {\n")
    status, out, err = report(run, "--spec", bad)
    assert status == 2 and "bad.msl has errors" in err and out == ""


def test_the_warm_up_is_max_10_or_5_percent():
    """The issue's rule: never judge the first max(10, 5% of the steps) steps."""
    t = Thresholds()
    assert [t.warmup(n) for n in (1, 60, 200, 201, 1000, 100000)] == [10, 10, 10, 11, 50, 5000]


def test_the_published_json_schema_is_the_reports():
    """docs/report.schema.json is RunReport's schema (regenerate it with
    `json.dumps(RunReport.model_json_schema(), indent=2)` when the models change)."""
    assert SCHEMA.read_text() == json.dumps(RunReport.model_json_schema(), indent=2) + "\n"


def test_the_json_holds_to_the_schema(tmp_path):
    jsonschema = require("jsonschema")
    run = lay_out(tmp_path, {0: HEADER + "".join(row(s) for s in range(1, 31))}, world=1)
    _, doc = notes(run)
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))


def test_validation_rising_again_without_a_new_best_is_the_same_alarm(tmp_path):
    """A run that overfits: the validation loss rises from step 30 on, dips by a hair at
    step 42 (which breaks the run of rises) and rises on: one alarm, at the first rise."""
    valid = {s: 3.0 - 0.01 * s for s in range(2, 29, 2)}
    valid |= {s: 2.72 + 0.01 * (s - 28) for s in range(30, 41, 2)}
    valid |= {42: valid[40] - 0.001} | {s: valid[40] + 0.01 * (s - 42) for s in range(44, 61, 2)}
    rows = "".join(
        row(s)[: -len(",,,\n")] + (f",{valid[s]:.6g},1,\n" if s in valid else ",,,\n")
        for s in range(1, 61)
    )
    status, out, _ = report(lay_out(tmp_path, {0: HEADER + rows}, world=1), "--json")
    alarms = [(a["kind"], a["step"]) for a in json.loads(out)["alarms"]]
    assert (status, alarms) == (1, [("valid_loss_rising", 30)])


def test_a_straggler_is_judged_against_the_other_ranks_alone(tmp_path):
    """docs/report.md's rule: a straggler took more than 1.25 x the median of the
    *other* ranks at the same step, 3 steps in a row. Two ranks at 0.128 s a step,
    rank 1 at 1.4 x that on steps 30-33: against the other rank alone 1.4 > 1.25, an
    alarm at step 30 on rank 1; a median that took the rank itself in would be
    (1 + 1.4) / 2 = 1.2, and 1.4 / 1.2 = 1.17 would pass it."""

    def log(rank: int) -> str:
        rows = [row(s) for s in range(1, 61)]
        for s in range(30, 34) if rank == 1 else ():
            rows[s - 1] = rows[s - 1].replace(",0.128,", f",{0.128 * 1.4:.6g},")
        return HEADER + "".join(rows)

    run = lay_out(tmp_path, {0: log(0), 1: log(1)}, world=2)
    status, out, _ = report(run, "--json")
    alarms = [(a["kind"], a["step"], a["ranks"]) for a in json.loads(out)["alarms"]]
    assert (status, alarms) == (1, [("straggler", 30, [1])])
