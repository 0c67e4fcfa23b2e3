"""Does `msgen estimate` cost the same for a 1-trillion-parameter model on 4096
devices as for a 7B model on 8? It should: repeats are never expanded.

    python bench/bench_estimate.py [-n 15]

Times `msgen estimate SPEC` for specs/gpt7b.msl and specs/validation/gpt1t_4096.msl
three ways, each N times after one untimed warm-up: the command as a user runs it
(process start included); the whole command in this process (read, parse, check,
estimate, render the text); and the memory model alone on the checked spec. Prints
each median and the ratios 1T / 7B. The model's cost grows with the pipeline stages
(64 here), the command's with the spec's text (the 1T spec lists 512 nodes), and
neither with the layers.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SPECS = {
    "gpt7b (8 devices)": "specs/gpt7b.msl",
    "gpt1t (4096 devices)": "specs/validation/gpt1t_4096.msl",
}


def msgen_command() -> list[str]:
    script = Path(sys.executable).parent / "msgen"
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from msgen.cli import main; sys.exit(main())"]


def command_times(spec: str, runs: int) -> list[float]:
    argv = msgen_command() + ["estimate", spec]
    times = []
    for i in range(runs + 1):
        start = time.perf_counter()
        proc = subprocess.run(argv, cwd=REPO, capture_output=True, check=False)
        elapsed = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"msgen estimate {spec} exited {proc.returncode}")
        if i:  # the first run writes bytecode and warms the file cache
            times.append(elapsed)
    return times


def in_process_times(spec: str, runs: int) -> list[float]:
    from msgen.cli import main

    times = []
    for i in range(runs + 1):
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = main(["estimate", str(REPO / spec)])
        elapsed = time.perf_counter() - start
        if code != 0:
            raise SystemExit(f"msgen estimate {spec} exited {code}")
        if i:  # the first run loads the grammar and the op library
            times.append(elapsed)
    return times


def model_times(spec: str, runs: int) -> list[float]:
    from msgen.analysis.plan import Plan
    from msgen.compiler import analyze
    from msgen.estimate.memory import estimate

    result = analyze(REPO / spec)
    times = []
    for i in range(runs + 1):
        start = time.perf_counter()
        estimate(Plan(result.spec, result.facts))
        elapsed = time.perf_counter() - start
        if i:
            times.append(elapsed)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--runs", type=int, default=15, help="timed runs per measurement")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    print(f"{args.runs} runs each, median, {sys.executable}")
    print(f"{'spec':<22} {'command':>10} {'in process':>11} {'model':>9}")
    medians = []
    for name, spec in SPECS.items():
        row = [
            statistics.median(measure(spec, args.runs))
            for measure in (command_times, in_process_times, model_times)
        ]
        medians.append(row)
        cmd, work, model = (t * 1e3 for t in row)
        print(f"{name:<22} {cmd:>8.1f}ms {work:>9.1f}ms {model:>7.2f}ms")
    small, big = medians
    ratios = [b / s for s, b in zip(small, big)]
    print(f"{'ratio 1T / 7B':<22} {ratios[0]:>10.2f} {ratios[1]:>11.2f} {ratios[2]:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
