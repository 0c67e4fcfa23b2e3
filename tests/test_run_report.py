"""`msgen report` on a real run: tests/specs/tiny_dp.msl (validation every 5 steps)
trained STEPS steps stand-alone by its generated train.py on the CPU, once for the
module. Then:

- the summary's numbers are the log's (numpy over the CSV is the oracle);
- the real log, with its step times steadied (this machine is shared, so its
  timing noise is not the run's), fires no alarm, and the raw log no alarm but
  timing ones;
- each fault injected into a copy of it (a NaN, a loss spike, a grad-norm spike,
  a run of skipped updates, rising validation loss, slow steps, a straggler
  rank, mismatched versions, a spec mismatch, growing memory) fires exactly one
  alarm, of its kind, at its step and rank;
- the HTML opens in headless Chromium with every panel drawn and no console
  message (its Content-Security-Policy forbids loading anything, so a fetch
  would be one), and its bytes are the same on a second run.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import platform
import shutil
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from statistics import median
from xml.etree import ElementTree

import numpy as np
import pytest

import msgen
from msgen.cli import main
from tests.emit_fixtures import SPECS, compile_spec
from tests.oracles import require

pytestmark = pytest.mark.slow

STEPS = 60  # warm-up: max(10, 5% of 60) = 10 steps; history alarms judge from step 21
EVAL_EVERY = 5
TRAIN_ROWS = 24  # three steps of 8 sequences
SPEC = SPECS["tiny_dp"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """The run's output folder (rank_0/log.csv)."""
    from mindspore.mindrecord import FileWriter

    root = tmp_path_factory.mktemp("run")
    folder = compile_spec(SPEC, root / "gen", "--set", f"train.eval_every={EVAL_EVERY}")
    rows = np.random.default_rng(7).integers(0, 256, (TRAIN_ROWS, 33), np.int32)
    # Validation on sequences it trains on: the validation loss falls with the training loss.
    for name, data in (("train.mindrecord", rows), ("valid.mindrecord", rows[:16])):
        writer = FileWriter(str(folder / name), shard_num=1)
        writer.add_schema({"input_ids": {"type": "int32", "shape": [-1]}}, "tokens")
        writer.write_raw_data([{"input_ids": r} for r in data])
        writer.commit()
    cmd = [sys.executable, "train.py", "--standalone", "--steps", str(STEPS)]
    env = {**os.environ, "GLOG_v": "3"}
    proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return folder / "output"


def read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def write(path: Path, rows: list[dict[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        out = csv.DictWriter(f, list(rows[0]))
        out.writeheader()
        out.writerows(rows)


def g(x: float) -> str:
    return f"{x:.6g}"  # as train.py writes a number


def report(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(["report", *map(str, argv)])
    return status, out.getvalue(), err.getvalue()


def alarms_of(run: Path, *extra: str) -> tuple[int, list[tuple[str, int, int]]]:
    status, out, err = report(run, "--json", *extra)
    assert status in (0, 1), err
    doc = json.loads(out)
    return status, [(a["kind"], a["step"], a["rank"], tuple(a["ranks"])) for a in doc["alarms"]]


# the summary ---------------------------------------------------------------------


def test_the_summary_is_the_logs(trained):
    rows = read(trained / "rank_0" / "log.csv")
    status, out, err = report(trained, "--json", "--spec", SPEC)
    doc = json.loads(out)
    s = doc["summary"]
    assert [int(r["step"]) for r in rows] == list(range(1, STEPS + 1))
    timed = [r for r in rows if int(r["step"]) > 10]  # after the warm-up
    assert s["steps"] == STEPS
    assert s["tokens"] == STEPS * 8 * 32  # global batch 8 x seq 32 per step
    assert s["loss"] == float(rows[-1]["loss"])
    assert s["valid_loss"] == float(rows[-1]["valid_loss"]) and s["valid_step"] == STEPS
    assert s["skipped"] == sum(int(r["skipped"]) for r in rows)
    assert s["timed_from"] == 11
    assert s["step_time_s"] == pytest.approx(np.median([float(r["step_time"]) for r in timed]))
    assert s["step_time_p10_s"] == pytest.approx(
        np.percentile([float(r["step_time"]) for r in timed], 10)
    )
    assert s["tokens_per_s_per_device"] == pytest.approx(
        np.median([float(r["tokens_per_s"]) for r in timed])
    )
    assert s["mfu"] == pytest.approx(np.median([float(r["mfu"]) for r in timed]))
    last = [(int(r["step"]), float(r["loss"])) for r in rows[-50:]]
    assert s["loss_trend_per_100_steps"] == pytest.approx(100 * np.polyfit(*zip(*last), 1)[0])
    assert s["peak_memory_bytes"] is None  # the CPU measures none


def test_predicted_against_measured_is_the_estimates(trained):
    status, out, _ = report(trained, "--json", "--spec", SPEC)
    predicted = json.loads(out)["predicted"]
    s = json.loads(out)["summary"]
    status, est, _ = json_estimate()
    assert predicted["step_s"]["predicted"] == est["time"]["step_s"]
    assert predicted["step_s"]["ratio"] == pytest.approx(s["step_time_s"] / est["time"]["step_s"])
    assert predicted["mfu"]["predicted"] == est["time"]["mfu"]
    assert [v["predicted"] for v in predicted["peak_bytes"]] == [
        st["total_bytes"] for st in est["stages"]
    ]
    # one process, a mesh of two: said, and no memory per stage measured
    assert any("1 process" in n for n in predicted["notes"])
    assert all(v["measured"] is None for v in predicted["peak_bytes"])


def json_estimate():
    out = io.StringIO()
    with redirect_stdout(out):
        status = main(["estimate", str(SPEC), "--json", "--set", f"train.eval_every={EVAL_EVERY}"])
    return status, json.loads(out.getvalue()), None


# provenance and memory --------------------------------------------------------------


def test_run_json_holds_where_the_run_comes_from(trained):
    import mindspore

    folder = trained.parent
    (segment,) = json.loads((trained / "rank_0" / "run.json").read_text())["segments"]
    manifest = (folder / "manifest.json").read_bytes()
    assert segment["versions"]["mindspore"] == mindspore.__version__
    commit = segment["versions"]["mindspore_commit"]
    assert (
        len(commit) >= 7
        and f"[sha1]:{commit}," in (Path(mindspore.__file__).parent / ".commit_id").read_text()
    )
    assert segment["versions"]["msgen"] == msgen.__version__
    assert segment["versions"]["python"] == platform.python_version()
    assert segment["spec"]["sha256"] == spec_sha256()
    assert segment["manifest_sha256"] == hashlib.sha256(manifest).hexdigest()
    assert (segment["rank"], segment["world"], segment["start_step"]) == (0, 1, 0)
    assert segment["argv"][1:] == ["--standalone", "--steps", str(STEPS)]
    assert segment["tokens_per_step"] == 8 * 32 and segment["mesh"] == {"dp": 2, "tp": 1, "pp": 1}
    assert segment["env"]["GLOG_v"] == "3"
    # no CANN on this host: the versions are absent, not guessed
    assert segment["versions"]["cann"] is None and segment["versions"]["driver"] is None


def spec_sha256() -> str:
    from msgen.compiler import analyze

    return analyze(SPEC).spec.sha256


def test_the_peak_memory_column_is_empty_on_the_cpu(trained):
    rows = read(trained / "rank_0" / "log.csv")
    assert all(r["peak_memory_bytes"] == "" for r in rows)  # max_memory_allocated() is 0


def test_a_resumed_run_appends_a_segment(trained, tmp_path):
    output = tmp_path / "output"
    shutil.copytree(trained, output)
    first = json.loads((output / "rank_0" / "run.json").read_text())["segments"]
    cmd = [sys.executable, "train.py", "--standalone", "--resume", "--steps", str(STEPS + 2),
           "--output", str(output)]  # fmt: skip
    done = subprocess.run(cmd, cwd=trained.parent, env={**os.environ, "GLOG_v": "3"},
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    segments = json.loads((output / "rank_0" / "run.json").read_text())["segments"]
    assert segments[0] == first[0] and len(segments) == 2
    assert segments[1]["start_step"] == STEPS and "--resume" in segments[1]["argv"]


# alarms ----------------------------------------------------------------------------


def steady(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    """The rows with every step after the first taking the median step time (tokens/s
    and MFU scaled with it)."""
    usual = median(float(r["step_time"]) for r in rows[1:])
    out = []
    for r in rows:
        took = float(r["step_time"])
        new = took if r["step"] == "1" else usual
        out.append(
            r | {"step_time": g(new), "tokens_per_s": g(float(r["tokens_per_s"]) * took / new),
                 "mfu": g(float(r["mfu"]) * took / new)}
        )  # fmt: skip
    return out


def clean(trained: Path, ranks: int = 1) -> dict[int, list[dict[str, str]]]:
    base = steady(read(trained / "rank_0" / "log.csv"))
    return {rank: [dict(r) for r in base] for rank in range(ranks)}


def provenance(rank: int, world: int, **change) -> dict:
    """A run.json as train.py writes it."""
    segment = {
        "rank": rank,
        "world": world,
        "start_step": 0,
        "spec": {"name": "tiny_dp", "path": "tests/specs/tiny_dp.msl", "sha256": "a" * 64},
        "manifest_sha256": "b" * 64,
        "versions": {"msgen": "0.1.0", "mindspore": "2.10.0", "python": "3.11.2"},
    }
    for key, value in change.items():
        segment[key] = value
    return {"segments": [segment]}


def lay_out(dest: Path, logs: dict[int, list[dict[str, str]]], jsons=None) -> Path:
    for rank, rows in logs.items():
        write(dest / f"rank_{rank}" / "log.csv", rows)
        if jsons is not None:
            (dest / f"rank_{rank}" / "run.json").write_text(json.dumps(jsons[rank]))
    return dest


def at(rows, step: int) -> dict[str, str]:
    return rows[step - 1]


def nan_loss(logs):
    at(logs[0], 40).update(loss="nan", perplexity="nan")


def loss_spike(logs):
    at(logs[0], 45)["loss"] = g(float(at(logs[0], 45)["loss"]) + 1.0)


def grad_spike(logs):
    at(logs[0], 50)["grad_norm"] = g(float(at(logs[0], 50)["grad_norm"]) * 10)


def skipped_run(logs):
    for step in range(25, 30):
        at(logs[0], step)["skipped"] = "1"


def valid_rising(logs):
    base = float(at(logs[0], 35)["valid_loss"])
    for i, step in enumerate((40, 45, 50), start=1):
        at(logs[0], step)["valid_loss"] = g(base + 0.1 * i)


def slow_steps(logs):
    for step in range(30, 33):
        at(logs[0], step)["step_time"] = g(float(at(logs[0], step)["step_time"]) * 2)


def straggler(logs):
    for step in range(30, 34):
        at(logs[1], step)["step_time"] = g(float(at(logs[1], step)["step_time"]) * 1.6)


def memory_growth(logs):
    for step, r in enumerate(logs[0], start=1):
        r["peak_memory_bytes"] = str(2**30 + 2**20 * max(0, min(step, 45) - 39))


def early_spike(logs):
    at(logs[0], 8)["loss"] = g(float(at(logs[0], 8)["loss"]) + 1.0)


def early_nan(logs):
    at(logs[0], 3).update(loss="nan", perplexity="nan")


def two_slow_steps(logs):
    for step in range(30, 32):
        at(logs[0], step)["step_time"] = g(float(at(logs[0], step)["step_time"]) * 2)


def nan_everywhere(logs):
    for rows in logs.values():
        at(rows, 40).update(loss="nan", perplexity="nan")


FAULTS = {
    # name: (ranks, inject, run.json changes of rank 1, the alarms: (kind, step, ranks))
    "nan": (1, nan_loss, None, [("nonfinite_loss", 40, (0,))]),
    "loss spike": (1, loss_spike, None, [("loss_spike", 45, (0,))]),
    "grad-norm spike": (1, grad_spike, None, [("grad_norm_spike", 50, (0,))]),
    "skipped updates": (1, skipped_run, None, [("skipped_updates", 25, (0,))]),
    "validation rising": (1, valid_rising, None, [("valid_loss_rising", 40, (0,))]),
    "slow steps": (1, slow_steps, None, [("slow_steps", 30, (0,))]),
    "straggler": (2, straggler, None, [("straggler", 30, (1,))]),
    "memory growth": (1, memory_growth, None, [("memory_growth", 40, (0,))]),
    "versions": (2, None, {"versions": {"msgen": "0.1.0", "mindspore": "2.9.0",
                                        "python": "3.11.2"}}, [("version_mismatch", 1, (1,))]),
    "spec": (2, None, {"manifest_sha256": "c" * 64}, [("spec_mismatch", 1, (1,))]),
    # the rules' edges
    "a spike in the warm-up is not judged": (1, early_spike, None, []),
    "a non-finite loss is, from step 1": (1, early_nan, None, [("nonfinite_loss", 3, (0,))]),
    "two slow steps are not three": (1, two_slow_steps, None, []),
    "one alarm for every rank": (2, nan_everywhere, None, [("nonfinite_loss", 40, (0, 1))]),
}  # fmt: skip


def test_a_clean_log_fires_no_alarm(trained, tmp_path):
    for ranks in (1, 2):
        run = lay_out(tmp_path / str(ranks), clean(trained, ranks),
                      {r: provenance(r, ranks) for r in range(ranks)})  # fmt: skip
        assert alarms_of(run) == (0, [])


def test_the_raw_log_fires_no_alarm_but_timing_ones(trained):
    _, alarms = alarms_of(trained)
    assert [a for a in alarms if a[0] not in ("slow_steps", "straggler")] == []


@pytest.mark.parametrize("fault", FAULTS)
def test_each_fault_fires_once_at_its_step_and_rank(trained, tmp_path, fault):
    ranks, inject, change, expected = FAULTS[fault]
    logs = clean(trained, ranks)
    if inject:
        inject(logs)
    jsons = {r: provenance(r, ranks, **(change if r == 1 and change else {})) for r in logs}
    status, alarms = alarms_of(lay_out(tmp_path, logs, jsons))
    assert alarms == [(kind, step, ranks[0], ranks) for kind, step, ranks in expected]
    assert status == (1 if expected else 0)


def test_the_run_json_spec_is_compared_when_it_is_here(trained, tmp_path, monkeypatch):
    """No --spec: the spec run.json names (relative to where msgen runs) is used."""
    run = lay_out(tmp_path / "run", clean(trained), {0: provenance(0, 1)})
    monkeypatch.chdir(SPEC.parents[2])
    status, out, _ = report(run, "--json")
    assert json.loads(out)["predicted"]["spec"] == "tests/specs/tiny_dp.msl"
    # its sha256 is not the run's: said
    assert any("another version" in n for n in json.loads(out)["predicted"]["notes"])
    monkeypatch.chdir(tmp_path)
    assert json.loads(report(run, "--json")[1])["predicted"] is None


# the pictures ----------------------------------------------------------------------

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")  # fmt: skip
PROBE = """<script>
const out = [];
for (const svg of document.querySelectorAll("svg.panel")) {
  const box = svg.getBoundingClientRect();
  const lines = [...svg.querySelectorAll("polyline.series")].map(l => {
    const b = l.getBBox();
    return [l.getTotalLength(), b.x, b.y, b.width, b.height];
  });
  out.push({id: svg.id, w: box.width, h: box.height, lines: lines,
            dots: svg.querySelectorAll("circle").length});
}
document.getElementById("probe").textContent = JSON.stringify(out);
</script>"""


def chromium(page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [require("chromium"), *FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_the_html_opens_in_chromium_with_every_plot_drawn(trained, tmp_path):
    page = tmp_path / "report.html"
    assert report(trained, "--spec", SPEC, "--html", page)[0] in (0, 1)
    html = page.read_text()
    # Loaded with its own policy (nothing may be fetched) and console logging: silent.
    seen = chromium(page, tmp_path / "p1", "--enable-logging=stderr", "--v=0", "--dump-dom")
    assert seen.returncode == 0, seen.stderr[-2000:]
    assert "CONSOLE" not in seen.stderr, seen.stderr
    assert seen.stdout.count('class="panel"') == 7
    # The same page with a probe that measures what the browser drew.
    probe = html.replace('<meta http-equiv="Content-Security-Policy"', "<meta x")
    probe = probe.replace("</body>", '<pre id="probe"></pre>' + PROBE + "</body>")
    probed = tmp_path / "probe.html"
    probed.write_text(probe)
    dom = chromium(probed, tmp_path / "p2", "--dump-dom").stdout
    drawn = json.loads(dom.split('<pre id="probe">')[1].split("</pre>")[0].replace("&quot;", '"'))
    assert [p["id"] for p in drawn] == [
        "loss", "lr", "grad_norm", "loss_scale", "step_time", "mfu", "peak_memory"
    ]  # fmt: skip
    for p in drawn:
        assert p["w"] > 600 and p["h"] > 200, p
        assert p["lines"], p["id"]  # every panel has a curve (memory: the estimate's line)
        for length, x, y, w, h in p["lines"]:
            assert length > 100 and 80 <= x and x + w <= 571 and 34 <= y and y + h <= 191, p
    assert len(next(p for p in drawn if p["id"] == "loss")["lines"]) == 2  # with validation


def test_html_and_svg_bytes_are_deterministic(trained, tmp_path):
    for option, name in (("--html", "a.html"), ("--svg", "a.svg")):
        first, second = tmp_path / name, tmp_path / ("b" + name)
        report(trained, "--spec", SPEC, option, first)
        report(trained, "--spec", SPEC, option, second)
        assert first.read_bytes() == second.read_bytes()
    svg = ElementTree.parse(tmp_path / "a.svg").getroot()
    assert len(svg.findall("{http://www.w3.org/2000/svg}svg")) == 7
    for banned in ("http:", "https:", "src=", "@import", "url(http"):
        assert banned not in (tmp_path / "a.html").read_text().replace(
            'xmlns="http://www.w3.org/2000/svg"', ""
        )


# two processes under msrun -------------------------------------------------------------


def test_a_two_process_msrun_run_reads_back(tmp_path):
    """tiny_dp as two data-parallel processes under its launch/msrun.sh, 4 steps: both
    ranks write run.json (the same versions: no alarm), and the summary is rank 0's log
    with tokens/s per device over the 2 devices."""
    from tests.test_multirank import finish, msrun

    folder = compile_spec(SPEC, tmp_path / "gen")
    finish(msrun(folder, folder, folder / "output", "--synthetic", "--steps", "4"), folder)
    status, out, err = report(folder / "output", "--json", "--spec", SPEC)
    doc = json.loads(out)
    assert (status, doc["alarms"], doc["notes"]) == (0, [], [])
    assert doc["world"] == 2 and [r["run_json"] for r in doc["ranks"]] == [True, True]
    segments = [
        json.loads((folder / "output" / f"rank_{r}" / "run.json").read_text())["segments"][0]
        for r in (0, 1)
    ]
    assert [(s["rank"], s["world"]) for s in segments] == [(0, 2), (1, 2)]
    assert segments[0]["versions"] == segments[1]["versions"]
    rows = read(folder / "output" / "rank_0" / "log.csv")
    s = doc["summary"]
    assert s["steps"] == 4 and s["loss"] == float(rows[-1]["loss"]) and s["timed_from"] == 2
    speeds = [float(r["tokens_per_s"]) for r in rows[1:]]
    assert s["tokens_per_s_per_device"] == pytest.approx(np.median(speeds) / 2)
