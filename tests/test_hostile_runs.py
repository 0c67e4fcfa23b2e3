"""`msgen report` and `msgen calibrate` on run folders that lie or are huge: one number
that would make them list a hundred million ranks, plots of values at the edge of
what a float holds, a straggler judged among thousands of ranks, a log of many rows,
run.json and calibration files of the wrong types or depth, a log.csv the csv module
refuses, terminal escapes in run.json, a calibration that would write Infinity, and a
run.json that names a file that is no spec. Each ends in a report (exit 0 or 1, what
was left out said in a note) or in one line naming the file and the key (exit 2),
never in a traceback, in bounded memory (the memory cases run in a child under an
address-space limit a little above what its imports take) and bounded work.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from statistics import median
from xml.etree import ElementTree

import pytest

from msgen.cli import main
from msgen.runs import alarms
from msgen.runs.alarms import judge
from msgen.runs.logs import read_run

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "specs" / "tiny.msl"
HEADER = (
    "step,loss,perplexity,lr,grad_norm,loss_scale,skipped,tokens_per_s,step_time,mfu,"
    "valid_loss,valid_perplexity,peak_memory_bytes\n"
)
SVG = "{http://www.w3.org/2000/svg}"


def row(step: int, loss: str | None = None, lr: str = "0.001", took: str = "0.128") -> str:
    loss = f"{5.0 - 0.01 * step:.6g}" if loss is None else loss
    return f"{step},{loss},1,{lr},1.5,65536,0,2000,{took},1e-05,,,\n"


def log(steps: int = 30, **values) -> str:
    return HEADER + "".join(row(s, **values) for s in range(1, steps + 1))


def lay_out(root: Path, logs: dict[int, str], run_json: dict | str | None = None) -> Path:
    for rank, text in logs.items():
        folder = root / f"rank_{rank}"
        folder.mkdir(parents=True)
        (folder / "log.csv").write_text(text)
        if run_json is not None:
            doc = run_json if isinstance(run_json, str) else json.dumps(run_json)
            (folder / "run.json").write_text(doc)
    return root


def segment(**values) -> dict:
    return {"segments": [{"rank": 0, "world": 1, "start_step": 0, "versions": {}, **values}]}


def msgen(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main([*map(str, argv)])
    return status, out.getvalue(), err.getvalue()


def one_line(status: int, err: str, *names: str) -> None:
    """Exit 2 and one line on stderr naming each of `names`, no traceback."""
    assert status == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for name in names:
        assert name in err, err


# A child that imports everything the run tools use, then limits its address space to
# what it has mapped plus a budget, and runs msgen.
BOUNDED = r"""
import resource, sys
from pathlib import Path
import msgen.compiler, msgen.runs.calibrate, msgen.runs.command, msgen.runs.plots
from msgen.cli import main
from msgen.resources import template
template("report/report.svg.j2"), template("report/report.html.j2")
mapped = next(int(line.split()[1]) * 1024 for line in Path("/proc/self/status").read_text()
              .splitlines() if line.startswith("VmSize:"))
limit = mapped + int(sys.argv[1]) * 2**20
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
sys.exit(main(sys.argv[2:]))
"""


def bounded(budget_mib: int, *argv, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", BOUNDED, str(budget_mib), *map(str, argv)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


# 1. Unbounded work from one number ---------------------------------------------------


def test_a_world_of_a_hundred_million_is_counted_not_listed(tmp_path):
    """run.json's `world` of 10^8: the ranks the run lacks are counted from the gaps
    (a set of every rank took 17.6 GB)."""
    run = lay_out(tmp_path / "run", {0: log()}, segment(world=10**8))
    done = bounded(64, "report", run, "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["notes"] == ["no log from ranks 1-99999999"]
    fit = bounded(64, "calibrate", run, "--spec", SPEC, "--fit", "matmul_efficiency")
    assert fit.returncode == 0, fit.stderr[-2000:]


def test_a_rank_folder_numbered_a_hundred_million_is_counted(tmp_path):
    run = lay_out(tmp_path / "run", {100_000_000: log()})
    done = bounded(64, "report", run, "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert doc["world"] == 100_000_001 and "no log from ranks 0-99999999" in doc["notes"]


@pytest.mark.parametrize("option", ["--svg", "--html"])
def test_ticks_end_when_the_spread_is_below_what_a_float_tells_apart(tmp_path, option):
    """The learning rate alternating 1e17 and 1e17 + 16 (one unit of the float's last
    place): adding the tick step to 1e17 left it where it was, and the tick loop ran
    forever. Ticks come from a count now."""
    lrs = ["1e17", "100000000000000016"]
    text = HEADER + "".join(row(s, lr=lrs[s % 2]) for s in range(1, 31))
    run = lay_out(tmp_path / "run", {0: text})
    out = tmp_path / f"plot{option.replace('--', '.')}"
    done = bounded(256, "report", run, option, out, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    panel = ElementTree.fromstring(out.read_text() if option == "--svg" else svg_of(out))
    lr = next(p for p in panel.iter(f"{SVG}svg") if p.get("id") == "lr")
    labels = [t for t in lr.iter(f"{SVG}text") if t.get("text-anchor") == "end"]
    assert 1 <= len(labels) <= 12


def svg_of(html: Path) -> str:
    """The HTML's panels inside one SVG element, for the XML parser."""
    text = html.read_text()
    panels = text[text.index("<svg") : text.rindex("</svg>") + len("</svg>")]
    return f'<svg xmlns="http://www.w3.org/2000/svg">{panels}</svg>'


def test_values_near_the_largest_float_are_drawn_inside_their_panel(tmp_path):
    """A loss alternating -1.7e308 and 1.7e308: their spread overflows a float (the
    tick step was infinite, a traceback); the axis is computed on half the spread."""
    losses = ["-1.7e308", "1.7e308"]
    text = HEADER + "".join(row(s, loss=losses[s % 2]) for s in range(1, 31))
    run = lay_out(tmp_path / "run", {0: text})
    status, _, err = msgen("report", run, "--svg", tmp_path / "a.svg")
    assert status in (0, 1), err
    svg = ElementTree.parse(tmp_path / "a.svg").getroot()
    loss = next(p for p in svg.iter(f"{SVG}svg") if p.get("id") == "loss")
    points = [
        tuple(map(float, xy.split(",")))
        for line in loss.iter(f"{SVG}polyline")
        for xy in line.get("points").split()
    ]
    assert len(points) == 30
    assert all(80 <= x <= 570 and 34 <= y <= 190 for x, y in points), points


def lay_out_ranks(root: Path, ranks: int, steps: int, slow: dict[int, float]) -> Path:
    """`ranks` ranks at 0.128 s a step, each rank r in `slow` slower by its factor
    from step 12 on."""
    for rank in range(ranks):
        took = 0.128 * slow.get(rank, 1.0)
        text = HEADER + "".join(
            row(s, took=f"{took if s >= 12 else 0.128:.6g}") for s in range(1, steps + 1)
        )
        lay_out(root, {rank: text})
    return root


def test_the_straggler_alarm_sorts_each_steps_times_once(tmp_path, monkeypatch):
    """The work of the alarms across ranks, counted as the values handed to `sorted`
    and `median` in msgen.runs.alarms: the straggler rule took the median of the other
    ranks afresh for each rank, ranks^2 values a step (3,000 ranks: 134 s); sorting
    each step's times once is ranks log ranks. Doubling the ranks must not come near
    quadrupling the work."""
    counted = [0]

    def counting(real):
        def wrapped(values, *args, **kwargs):
            values = list(values)
            counted[0] += len(values)
            return real(values, *args, **kwargs)

        return wrapped

    monkeypatch.setattr(alarms, "sorted", counting(sorted), raising=False)
    monkeypatch.setattr(alarms, "median", counting(median))
    work = {}
    for ranks in (150, 300):
        run = read_run(lay_out_ranks(tmp_path / str(ranks), ranks, 16, {7: 1.6}))
        counted[0] = 0
        found = [(a.kind, a.step, a.ranks) for a in judge(run)]
        assert found == [("straggler", 12, (7,))]
        work[ranks] = counted[0]
    assert work[300] / work[150] < 2.5, work


@pytest.mark.parametrize("gaps", [False, True], ids=["same steps", "steps missing"])
@pytest.mark.parametrize("ranks", [7, 8])
def test_the_straggler_rule_is_the_median_of_the_other_ranks(tmp_path, ranks, gaps):
    """Random step times (some ranks slow for stretches) against the rule as
    docs/report.md states it, computed here the slow way: at each step after the
    warm-up, a rank's time over statistics.median of the times of the other ranks that
    logged the step, above 1.25 at 3 of its steps in a row; an alarm at the first.
    Odd and even counts of others; every rank at every step (read row by row), and
    ranks that lack some steps (merged by step)."""
    rng = random.Random(ranks)
    steps = 60
    times = {r: [0.1 * rng.uniform(0.9, 1.1) for _ in range(steps)] for r in range(ranks)}
    for _ in range(6):
        r, start = rng.randrange(ranks), rng.randrange(steps - 6)
        for s in range(start, start + rng.randrange(2, 6)):
            times[r][s] *= rng.uniform(1.2, 1.6)
    logged = {r: set(range(steps)) for r in range(ranks)}
    if gaps:
        for r in range(ranks):
            logged[r] -= set(rng.sample(range(steps), 8))
    logs = {r: HEADER + "".join(row(s + 1, took=repr(times[r][s])) for s in sorted(logged[r]))
            for r in range(ranks)}  # fmt: skip
    run = read_run(lay_out(tmp_path / "run", logs))
    warm = alarms.DEFAULT.warmup(max(max(kept) for kept in logged.values()) + 1)
    expected = []
    for r in range(ranks):
        run_of, first = 0, None  # straggling steps in a row so far, from the first
        for s in sorted(logged[r] - {0}):  # step s + 1; step 1 never counts
            others = [times[q][s] for q in range(ranks) if q != r and s in logged[q]]
            if not others:
                continue
            late = s + 1 > warm and times[r][s] / median(others) > 1.25
            run_of, first = (run_of + 1, first if run_of else s) if late else (0, None)
            if run_of == 3:
                expected.append((first + 1, r))
    found = [(a.step, rank) for a in judge(run) if a.kind == "straggler" for rank in a.ranks]
    assert sorted(found) == sorted(expected) and expected


def test_a_long_log_is_read_in_bounded_memory(tmp_path):
    """50,000 rows: held as a table of doubles, some 90 bytes a row (as dicts of
    floats, 1.7 KB a row: 85 MB here, 1.7 GB for a million)."""
    run = lay_out(tmp_path / "run", {0: log(50_000)})
    done = bounded(40, "report", run)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "steps 50000" in done.stdout


# 4. Lying input ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "doc, key",
    [
        (segment(spec={"path": "x.msl", "sha256": [1]}), "segments[0].spec.sha256"),
        (segment(spec="specs/tiny.msl"), "segments[0].spec: expected an object"),
        (segment(versions=["msgen", "0.1"]), "segments[0].versions: expected an object"),
        ('{"segments": [' + "[" * 100_000 + "]" * 100_000 + "]}", "nested deeper"),
        ({"segments": {"0": {}}}, "segments: expected a list"),
    ],
    ids=["unhashable", "spec-a-string", "versions-a-list", "deep", "segments-an-object"],
)
def test_a_run_json_of_the_wrong_shape_is_one_line_naming_the_key(tmp_path, doc, key):
    run = lay_out(tmp_path / "run", {0: log()}, doc)
    status, out, err = msgen("report", run, "--spec", SPEC)
    one_line(status, err, "rank_0/run.json", key)


def test_a_400_digit_world_is_one_line(tmp_path):
    """As a number it was a world of 10^400 ranks, listed."""
    run = lay_out(tmp_path / "run", {0: log()}, '{"segments": [{"world": ' + "9" * 400 + "}]}")
    done = bounded(64, "report", run, timeout=60)
    one_line(done.returncode, done.stderr, "rank_0/run.json", "an integer of 400 digits")


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"format": "msgen-calibration 1", "device": "ascend910b", "values": '
         '{"matmul_efficiency": ' + "9" * 400 + "}}", "an integer of 400 digits"),
        ("[" * 100_000 + "]" * 100_000, "nested deeper"),
        ('{"format": "msgen-calibration 1", "device": "ascend910b", "values": '
         '{"matmul_efficiency": [0.5]}}', "values.matmul_efficiency: expected a number"),
    ],
    ids=["400-digits", "deep", "value-a-list"],
)  # fmt: skip
@pytest.mark.parametrize("command", ["estimate", "report"])
def test_a_calibration_file_that_lies_is_one_line(tmp_path, text, message, command):
    calibration = tmp_path / "cal.json"
    calibration.write_text(text)
    argv = (
        [SPEC] if command == "estimate" else [lay_out(tmp_path / "run", {0: log()}), "--spec", SPEC]
    )
    status, _, err = msgen(command, *argv, "--calibration", calibration)
    one_line(status, err, "cal.json", message)


CASES = {
    # a quoted field over lines each within the limit, past it in all: csv.Error, and
    # the reader starts again on the next line
    "csv-error": (log() + '31,"' + ("x" * 10_000 + "\n") * 3 + row(32),
                  "rank 0: line 33: field larger than field limit (16384) (ignored)"),
    "long-line": (log() + "31," + "9" * 200_000 + "\n" + row(32),
                  "rank 0: line 32 is longer than 16384 characters (ignored)"),
    "400-digit-step": (log() + row(10**400, loss="4.7") + row(32),
                       "rank 0: line 32 is malformed (ignored)"),
}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_a_log_the_csv_module_refuses_or_a_huge_step_is_a_note(tmp_path, case):
    """Whatever field limit the process holds (importing MindSpore sets 10 MiB): the
    log's is its own, and the process's is left as it was."""
    text, note = CASES[case]
    run = lay_out(tmp_path / "run", {0: text})
    before = csv.field_size_limit(10 * 2**20)
    try:
        status, out, err = msgen("report", run, "--json", "--svg", tmp_path / "a.svg")
        assert csv.field_size_limit() == 10 * 2**20
    finally:
        csv.field_size_limit(before)
    assert status in (0, 1), err
    doc = json.loads(out)
    assert note in doc["notes"], doc["notes"]
    assert doc["summary"]["steps"] == 32


def test_a_log_of_steps_alone_is_read(tmp_path):
    """No column the report reads but `step`: the steps are read (the row's other
    fields are not taken for them)."""
    run = lay_out(tmp_path / "run", {0: "step,other\n1,x\n22,y\n"})
    status, out, err = msgen("report", run, "--json", "--svg", tmp_path / "a.svg")
    assert status == 0, err
    assert json.loads(out)["ranks"][0] | {"run_json": None} == {
        "rank": 0, "first_step": 1, "last_step": 22, "rows": 2, "run_json": None, "segments": 0
    }  # fmt: skip


# 5. Unclear or unsafe messages ---------------------------------------------------------


def test_run_json_values_and_folder_names_are_quoted_printably(tmp_path):
    """A host, a version and a start time carrying terminal escapes and a line break,
    in the terminal summary and in the alarm they raise, and a folder name with an
    escape: shown escaped, never acted on, and no line is forged."""
    evil = {"host": "h\x1b]0;owned\x07", "started": "now\nno alarms",
            "versions": {"msgen": "0.1\x1b[2J"}}  # fmt: skip
    run = tmp_path / "run\x1b[31m"
    lay_out(run, {0: log()}, segment(world=2, **evil))
    other = segment(world=2, rank=1)
    lay_out(run, {1: log()}, other)
    status, out, err = msgen("report", run)
    assert status == 1, err  # the versions differ: an alarm
    assert "\x1b" not in out and "\x07" not in out and "\nno alarms" not in out, out
    assert "run\\x1b[31m" in out and "h\\x1b]0;owned\\x07" in out and "now\\nno alarms" in out
    assert "version_mismatch: msgen None here, 0.1\\x1b[2J on rank 0" in out


def test_calibrate_never_writes_infinity(tmp_path):
    """A step of 5e-324 s made the relative error infinite, written as `Infinity`
    (no JSON reader takes it)."""
    run = lay_out(tmp_path / "run", {0: log(took="5e-324")}, segment())
    out = tmp_path / "cal.json"
    status, _, err = msgen("calibrate", run, "--spec", SPEC, "--fit", "matmul_efficiency",
                           "-o", out)  # fmt: skip
    one_line(status, err, str(run), "no training step")
    assert not out.exists()


@pytest.mark.parametrize("how", ["absolute", "relative", "link named .msl"])
def test_a_spec_path_that_is_no_spec_is_not_read(tmp_path, monkeypatch, how):
    """run.json's spec path is read only when it is a regular .msl file, links
    followed: a run folder from elsewhere naming a secret (directly, as ../, or through
    a link named x.msl in the run) makes msgen neither read nor quote it."""
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET = 1\n")
    work = tmp_path / "work"
    run = work / "run"
    named = {"absolute": str(secret), "relative": "../secret.txt", "link named .msl": "run/x.msl"}
    lay_out(run, {0: log()}, segment(spec={"path": named[how]}))
    (run / "x.msl").symlink_to(secret)
    monkeypatch.chdir(work)
    status, out, err = msgen("report", "run")
    assert status == 0, err
    assert "TOPSECRET" not in out + err
    assert f"run.json names the spec {named[how]}, which is not a .msl file: not read" in out
