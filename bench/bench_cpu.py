"""CPU time of `msgen check` and `msgen compile` (user + system, process start
included), measured cold: each run is a fresh process with an empty temporary
folder and output folder. msgen's bytecode is compiled first, as installing a wheel
does (and PYTHONDONTWRITEBYTECODE is dropped for the runs): the number is a user's,
not the cost of compiling msgen's sources each time. The commands keep no cache of
their own (the LALR tables ship with msgen, msgen/syntax/msl_tables.py).

    python bench/bench_cpu.py [-n 11] [--spec specs/gpt7b.msl]

Prints, per command, the median and the fastest CPU seconds, the median as a ratio
to the command's target (issue 9: check 0.20 s, compile 0.45 s for gpt7b), and as a
ratio to `import msgen` (interpreter start-up factored out). Commands run in turn,
one run of each per round, so a burst of load elsewhere touches all alike.
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
TARGETS = {"check": 0.20, "compile": 0.45}  # CPU seconds for specs/gpt7b.msl


def cpu_seconds(argv: list[str], spec: str) -> float:
    """One run's CPU time: the child's user + system seconds."""
    with tempfile.TemporaryDirectory(prefix="msgen-bench-") as tmp:
        env = dict(os.environ, TMPDIR=tmp, PYTHONPATH=str(REPO))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        args = [a.format(spec=spec, out=str(Path(tmp) / "out")) for a in argv]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run([sys.executable, *args], env=env, capture_output=True)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} exited {done.returncode}:\n{done.stderr.decode()}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(runs: int, spec: str) -> None:
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "msgen")], check=True)
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(runs):
        for name, argv in COMMANDS.items():
            times[name].append(cpu_seconds(argv, spec))
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, t in times.items():
        print(f"{name:14} median {medians[name]:.3f} s CPU, fastest {min(t):.3f} s")
    base = medians["import msgen"]
    for name, target in TARGETS.items():
        print(
            f"{name:14} {medians[name] / target:.2f} x its target ({target:.2f} s), "
            f"{medians[name] / base:.1f} x import msgen"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=11, help="rounds (default 11)")
    parser.add_argument("--spec", default=str(REPO / "specs" / "gpt7b.msl"))
    args = parser.parse_args()
    main(args.n, args.spec)
