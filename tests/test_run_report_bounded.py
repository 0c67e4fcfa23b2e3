"""`msgen report` on a log that alarms on every other row lists a bounded number of alarms
in the text, the HTML and the JSON alike: the first ALARMS_LISTED of each kind by step,
then per kind how many more and the steps they span; the count in the heading is every
alarm. The oracle is the log's construction: a NaN loss at every even step is one
nonfinite_loss alarm each (a single row is a streak, docs/report.md), and a run of
`skipped_run` skipped updates after every gap is one skipped_updates alarm each. No
MindSpore: the log is written as train.py writes it.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from msgen.cli import main
from msgen.runs.alarms import DEFAULT
from msgen.runs.output import ALARMS_LISTED

HEADER = (
    "step,loss,perplexity,lr,grad_norm,loss_scale,skipped,tokens_per_s,step_time,mfu,"
    "valid_loss,valid_perplexity,peak_memory_bytes\n"
)
ROWS = 60_000  # 30,000 NaN losses; a whole report of it in a few seconds
SKIP = DEFAULT.skipped_run + 1  # a period: skipped_run skipped rows, then one update


def alarming_log(folder: Path) -> None:
    lines = [HEADER]
    for step in range(1, ROWS + 1):
        loss = "nan" if step % 2 == 0 else f"{5 - step / ROWS:.6g}"
        skipped = 0 if step % SKIP == 0 else 1
        lines.append(f"{step},{loss},1,0.001,1.5,65536,{skipped},2000,0.128,0.4,,,\n")
    (folder / "rank_0").mkdir(parents=True)
    (folder / "rank_0" / "log.csv").write_text("".join(lines))


def report(*argv) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        status = main(["report", *map(str, argv)])
    return status, out.getvalue()


def test_a_log_alarming_on_every_other_row_gives_a_bounded_report(tmp_path):
    run = tmp_path / "run"
    alarming_log(run)
    nan_steps = list(range(2, ROWS + 1, 2))
    skip_steps = list(range(1, ROWS + 1, SKIP))  # each run of skipped rows starts there
    total = len(nan_steps) + len(skip_steps)

    status, out = report(run, "--json")
    assert status == 1
    doc = json.loads(out)
    assert doc["alarm_count"] == total and not doc["healthy"]
    listed = {
        kind: [a["step"] for a in doc["alarms"] if a["kind"] == kind]
        for kind in ("nonfinite_loss", "skipped_updates")
    }
    assert listed == {
        "nonfinite_loss": nan_steps[:ALARMS_LISTED],
        "skipped_updates": skip_steps[:ALARMS_LISTED],
    }
    assert len(doc["alarms"]) == 2 * ALARMS_LISTED
    assert [a["step"] for a in doc["alarms"]] == sorted(a["step"] for a in doc["alarms"])
    left = [
        ("nonfinite_loss", len(nan_steps) - ALARMS_LISTED, nan_steps[ALARMS_LISTED], nan_steps[-1]),
        (
            "skipped_updates",
            len(skip_steps) - ALARMS_LISTED,
            skip_steps[ALARMS_LISTED],
            skip_steps[-1],
        ),
    ]  # fmt: skip  (in KINDS' order)
    assert [tuple(x.values()) for x in doc["alarms_left_off"]] == left
    assert len(out) < 20_000

    status, text = report(run)
    assert status == 1
    lines = text.splitlines()
    assert f"{total:,} alarms:" in lines
    assert (
        f"  and {len(nan_steps) - ALARMS_LISTED:,} more nonfinite_loss (steps 42-{ROWS})" in lines
    )
    alarm_lines = [x for x in lines if x.startswith("  step ") and ", rank 0: " in x]
    assert len(alarm_lines) == 2 * ALARMS_LISTED and len(text) < 10_000

    html = tmp_path / "report.html"
    assert report(run, "--html", html)[0] == 1
    page = html.read_text()
    assert page.count('<li class="alarm">') == 2 * ALARMS_LISTED + 2
    assert f"{total:,} alarms</h2>" in page
    assert f"and {len(skip_steps) - ALARMS_LISTED:,} more skipped_updates" in page
    assert len(page) < 200_000
