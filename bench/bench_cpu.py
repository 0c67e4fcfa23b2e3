"""CPU time of `msgen check` and `msgen compile` (user + system, process start
included), measured cold: each run is a fresh process with an empty temporary
folder, so no cache of an earlier run is found. msgen's bytecode is compiled first,
as installing a wheel does (and PYTHONDONTWRITEBYTECODE is dropped for the runs):
the number is a user's, not the cost of compiling msgen's sources each time.

    python bench/bench_cpu.py [-n 11] [--spec specs/gpt7b.msl] [--warm]

`--warm` shares one temporary folder between the runs instead (after one untimed
run), as a user's second run finds it.

Prints, per command, the median and the fastest CPU seconds, and the median as a
ratio to `import msgen` (interpreter start-up factored out).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MAIN = "import sys; from msgen.cli import main; sys.exit(main())"
COMMANDS: dict[str, list[str]] = {
    "import msgen": ["-c", "import msgen"],
    "check": ["-c", MAIN, "check", "{spec}"],
    "compile": ["-c", MAIN, "compile", "{spec}", "-o", "{out}"],
}


def cpu_seconds(argv: list[str]) -> float:
    """One run's CPU time: the child's user + system seconds."""
    with tempfile.TemporaryDirectory(prefix="msgen-bench-") as fresh:
        tmp = WARM or fresh
        env = dict(os.environ, TMPDIR=tmp, PYTHONPATH=str(REPO))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        args = [a.format(spec=ARGS.spec, out=str(Path(tmp) / "out")) for a in argv]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run([sys.executable, *args], env=env, capture_output=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} exited {done.returncode}:\n{done.stderr.decode()}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "msgen")], check=True)
    medians = {}
    for name, argv in COMMANDS.items():
        if WARM:
            cpu_seconds(argv)
        times = [cpu_seconds(argv) for _ in range(ARGS.n)]
        medians[name] = statistics.median(times)
        print(f"{name:14} median {medians[name]:.3f} s CPU, fastest {min(times):.3f} s")
    base = medians["import msgen"]
    for name in ("check", "compile"):
        print(f"{name:14} {medians[name] / base:.2f} x import msgen")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=11, help="runs per command (default 11)")
    parser.add_argument("--spec", default=str(REPO / "specs" / "gpt7b.msl"))
    parser.add_argument("--warm", action="store_true", help="keep caches between runs")
    ARGS = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="msgen-bench-warm-") as shared:
        WARM = shared if ARGS.warm else None
        main()
