"""Wall time of the msgen command line, as a user sees it (process start included).

    python bench/bench_cli.py [-n 15] [--only check,estimate] [--spec specs/gpt7b.msl]

Runs each command of COMMANDS N times (after one untimed warm-up run), prints the median
and the fastest run, and each command's median as a ratio to the `import msgen`
baseline: the ratio is the cost of the work itself, with interpreter start-up factored
out. A command that fails is reported with its exit code and left out of the ratios.
Adding a command is one line in COMMANDS.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BASELINE = "import msgen"

# name -> argv; "{msgen}" is the msgen command, "{python}" this interpreter,
# "{spec}" the spec and "{out}" a scratch output folder.
COMMANDS: dict[str, list[str]] = {
    BASELINE: ["{python}", "-c", "import msgen"],
    "check": ["{msgen}", "check", "{spec}"],
    "estimate": ["{msgen}", "estimate", "{spec}"],
    "estimate --json": ["{msgen}", "estimate", "{spec}", "--json"],
    "compile": ["{msgen}", "compile", "{spec}", "-o", "{out}"],
}


def msgen_command() -> list[str]:
    """The installed `msgen` script beside this interpreter, else the CLI via -c."""
    script = Path(sys.executable).parent / "msgen"
    if script.is_file():
        return [str(script)]
    found = shutil.which("msgen")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from msgen.cli import main; sys.exit(main())"]


def expand(argv: list[str], *, spec: str, out: str) -> list[str]:
    result: list[str] = []
    for arg in argv:
        if arg == "{msgen}":
            result.extend(msgen_command())
        elif arg == "{python}":
            result.append(sys.executable)
        else:
            result.append(arg.format(spec=spec, out=out))
    return result


def time_runs(argv: list[str], runs: int) -> tuple[list[float], int]:
    """Seconds per run, and the exit code of the first failing run (0 if none failed)."""
    times: list[float] = []
    for i in range(runs + 1):
        start = time.perf_counter()
        proc = subprocess.run(argv, cwd=REPO, capture_output=True, check=False)
        elapsed = time.perf_counter() - start
        if proc.returncode != 0:
            return times, proc.returncode
        if i > 0:  # the first run warms caches and writes bytecode
            times.append(elapsed)
    return times, 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--runs", type=int, default=15, help="timed runs per command")
    parser.add_argument("--spec", default="specs/gpt7b.msl", help="spec, relative to the repo")
    parser.add_argument(
        "--only",
        help="comma-separated command names to run (the baseline always runs): "
        + ", ".join(name for name in COMMANDS if name != BASELINE),
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")

    names = list(COMMANDS)
    if args.only:
        wanted = [name.strip() for name in args.only.split(",") if name.strip()]
        unknown = [name for name in wanted if name not in COMMANDS]
        if unknown:
            parser.error(f"unknown command(s): {', '.join(unknown)}")
        names = [BASELINE] + [name for name in names if name in wanted and name != BASELINE]

    print(f"{args.runs} runs each, spec {args.spec}, {sys.executable}")
    print(f"{'command':<18} {'median':>10} {'fastest':>10} {'× import':>9}")
    baseline: float | None = None
    failed = 0
    with tempfile.TemporaryDirectory(prefix="msgen-bench-") as out:
        for name in names:
            cmd = expand(COMMANDS[name], spec=args.spec, out=out)
            times, code = time_runs(cmd, args.runs)
            if code != 0:
                failed += 1
                print(f"{name:<18} {'failed (exit ' + str(code) + ')':>21}")
                continue
            median = statistics.median(times)
            if name == BASELINE:
                baseline = median
            ratio = f"{median / baseline:.2f}" if baseline else "-"
            print(f"{name:<18} {median * 1e3:>8.1f}ms {min(times) * 1e3:>8.1f}ms {ratio:>9}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
