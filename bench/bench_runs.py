"""Time and memory of `msgen report` on large runs, against the work no reader of them
can skip.

    python bench/bench_runs.py [-n 5] [--rows 1000000] [--ranks 3000] [--steps 50]
                               [--against CHECKOUT]

Builds two runs: one rank with a log.csv of `--rows` rows (a loss falling with noise,
a validation every 1,000 steps), and `--ranks` ranks of `--steps` steps each (rank 7
a straggler from step 20 on). Then, in fresh processes, the kinds interleaved (log,
csv, alarms, sort, log, csv, ...):

- log: the whole `msgen report` of the long run (read, alarms, summary, text);
- csv: the floor of reading that log: csv.reader over the file and float() of every
  field, nothing kept; target: log / csv at most LOG_TARGET;
- alarms: the alarms across the ranks of the many-rank run, slow steps and
  stragglers (the run read before the clock starts);
- sort: the floor of judging ranks against each other at each step: the step times
  of every step gathered and sorted once; target: alarms / sort at most
  ALARMS_TARGET.

Memory is the peak resident set above the process's own after its imports (reset
through /proc/self/clear_refs, read as VmHWM), per row of the long log; target: at
most BYTES_TARGET bytes a row. Prints the median and spread (min..max) of each kind,
each ratio against its target, by the wall clock and by the process's CPU time (on a
shared machine the wall time holds waits for a core too), and with `--against` the same
kinds timed on another checkout (for a before and after).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOG_TARGET = 3.0
ALARMS_TARGET = 5.0
BYTES_TARGET = 150
HEADER = (
    "step,loss,perplexity,lr,grad_norm,loss_scale,skipped,tokens_per_s,step_time,mfu,"
    "valid_loss,valid_perplexity,peak_memory_bytes\n"
)

CHILD = r"""
import csv, io, json, sys, time
from contextlib import redirect_stdout
from pathlib import Path
sys.path.insert(0, {repo!r})
import msgen.compiler, msgen.runs.command  # noqa: F401  (report imports them; not counted)
from msgen.cli import main
from msgen.runs import alarms
from msgen.runs.logs import read_run

def across_ranks(run):
    # the alarms across ranks: slow steps and stragglers (two functions before)
    warm = alarms.DEFAULT.warmup(max(r.last_step for r in run.ranks))
    if hasattr(alarms, "timing_alarms"):
        return alarms.timing_alarms(run, warm, alarms.DEFAULT)
    return alarms.slow_alarms(run, warm, alarms.DEFAULT) + alarms.straggler_alarms(
        run, warm, alarms.DEFAULT)

def status(key):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

what, folder = sys.argv[1], Path(sys.argv[2])
run = read_run(folder) if what in ("alarms", "sort") else None
base = status("VmRSS")
Path("/proc/self/clear_refs").write_text("5")  # the high-water mark restarts here
start, cpu = time.perf_counter(), time.process_time()
if what == "log":
    with redirect_stdout(io.StringIO()):
        main(["report", str(folder)])
elif what == "csv":
    with open(folder / "rank_0" / "log.csv", newline="") as f:
        rows = csv.reader(f)
        next(rows)
        for fields in rows:
            [float(x) for x in fields if x]
elif what == "alarms":
    found = across_ranks(run)
    assert [(a.kind, a.step, a.ranks) for a in found] == [("straggler", 20, (7,))], found
else:
    by_step = {{}}
    for r in run.ranks:
        for step, took in r.series("step_time"):
            by_step.setdefault(step, []).append(took)
    for step in sorted(by_step):
        sorted(by_step[step])
took, cpu = time.perf_counter() - start, time.process_time() - cpu
print(json.dumps({{"seconds": took, "cpu": cpu, "peak": status("VmHWM") - base}}))
"""


def long_log(folder: Path, rows: int) -> None:
    rng = random.Random(0)
    (folder / "rank_0").mkdir(parents=True)
    with (folder / "rank_0" / "log.csv").open("w") as f:
        f.write(HEADER)
        for s in range(1, rows + 1):
            loss = 5.0 / (1 + s / 1000) + rng.gauss(0, 0.01)
            valid = f"{loss:.4f}" if s % 1000 == 0 else ""
            f.write(f"{s},{loss:.6g},1,0.0003,{1.5 + rng.gauss(0, 0.05):.6g},65536,0,"
                    f"{2000 + rng.gauss(0, 20):.1f},{0.128 + rng.gauss(0, 0.002):.6g},0.41,"
                    f"{valid},{valid},\n")  # fmt: skip


def many_ranks(folder: Path, ranks: int, steps: int) -> None:
    rng = random.Random(1)
    for rank in range(ranks):
        (folder / f"rank_{rank}").mkdir(parents=True)
        slow = 1.6 if rank == 7 else 1.0
        lines = [
            f"{s},{5 - s / 100:.6g},1,0.0003,1.5,65536,0,2000,"
            f"{0.128 * (slow if s >= 20 else 1) * rng.uniform(0.98, 1.02):.6g},0.41,,,\n"
            for s in range(1, steps + 1)
        ]
        (folder / f"rank_{rank}" / "log.csv").write_text(HEADER + "".join(lines))


def measure(repo: Path, what: str, folder: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD.format(repo=str(repo)), what, str(folder)],
        capture_output=True,
        text=True,
        cwd=repo,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def spread(values: list[float], unit: str) -> str:
    return f"{statistics.median(values):8.2f} {unit} ({min(values):.2f}..{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5, help="runs of each kind (default 5)")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--ranks", type=int, default=3000)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--against", type=Path, help="another checkout, timed the same way")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-runs-") as tmp:
        work = Path(tmp)
        long_log(work / "long", options.rows)
        many_ranks(work / "many", options.ranks, options.steps)
        kinds = {"log": work / "long", "csv": work / "long", "alarms": work / "many",
                 "sort": work / "many"}  # fmt: skip
        repos = {"this": REPO} | ({"against": options.against} if options.against else {})
        seconds = {(r, k): [] for r in repos for k in kinds}
        cpu = {(r, k): [] for r in repos for k in kinds}
        peaks = {(r, k): [] for r in repos for k in kinds}
        for _ in range(options.n):
            for r, repo in repos.items():
                for kind, folder in kinds.items():
                    if r != "this" and kind in ("csv", "sort"):
                        continue  # the floors do not depend on the checkout
                    got = measure(repo, kind, folder)
                    seconds[(r, kind)].append(got["seconds"])
                    cpu[(r, kind)].append(got["cpu"])
                    peaks[(r, kind)].append(got["peak"] / options.rows)
        print(f"long log: {options.rows:,} rows; many ranks: {options.ranks:,} x "
              f"{options.steps} steps")  # fmt: skip
        for (r, kind), values in seconds.items():
            if values:
                print(f"{r:8s} {kind:7s} {spread(values, 's')}  cpu {spread(cpu[(r, kind)], 's')}")
        # Wall time and the process's CPU time: on a shared machine the wall time
        # also holds the waits for a core, which the CPU time leaves out.
        for clock, times in (("wall", seconds), ("cpu", cpu)):
            med = {key: statistics.median(v) for key, v in times.items() if v}
            for name, top, bottom, target in (
                ("log / csv", "log", "csv", LOG_TARGET),
                ("alarms / sort", "alarms", "sort", ALARMS_TARGET),
            ):
                ratio = med[("this", top)] / med[("this", bottom)]
                verdict = "within" if ratio <= target else "ABOVE"
                print(f"{clock} {name} = {ratio:.2f}, {verdict} target {target}")
        per_row = statistics.median(peaks[("this", "log")])
        verdict = "within" if per_row <= BYTES_TARGET else "ABOVE"
        print(f"log peak memory above imports: {per_row:.0f} bytes a row "
              f"({spread(peaks[('this', 'log')], 'B')}), {verdict} target {BYTES_TARGET}")  # fmt: skip
        if options.against:
            print(f"against: log peak {statistics.median(peaks[('against', 'log')]):.0f} "
                  "bytes a row")  # fmt: skip


if __name__ == "__main__":
    main()
