"""Is `msgen check` linear in the number of `model` statements, up to the 16 MiB
spec limit? Two shapes of model block, n statements each:

- chain:   d1 = 1, d2 = d1 + 1, ... (every dim uses the one above it)
- unknown: u1 = x1, u2 = x2, ...    (every dim uses a name nothing defines:
           n MSL101 errors)

    python bench/bench_check_scale.py [-r 3] [--smallest N] [--largest N] [--shape S]

For n doubling up to the largest spec under 16 MiB, the check of every size runs
in turn, round after round (interleaved, so a slow moment of a shared machine
spreads over all sizes), in this process, the parse included. Prints per size the
median, the spread (max - min) and the time per statement; the ratio of the
largest size's time per statement to the smallest's (1.0 is linear; quadratic
doubles it at each doubling), against the target of at most 2.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from msgen.compiler import analyze_text  # noqa: E402
from msgen.syntax.parser import SPEC_LIMIT  # noqa: E402

BASE = (REPO / "tests" / "cases" / "base.msl").read_text()
TARGET = 2.0


def spec(shape: str, n: int) -> str:
    if shape == "chain":
        lines = ["    d0 = 1"] + [f"    d{i} = d{i - 1} + 1" for i in range(1, n)]
    else:
        lines = [f"    u{i} = x{i}" for i in range(n)]
    return BASE.replace("model tiny {\n", "model tiny {\n" + "\n".join(lines) + "\n", 1)


def sizes(shape: str, smallest: int, largest: int | None) -> list[int]:
    out, n = [], smallest
    while len(spec(shape, n).encode()) <= SPEC_LIMIT and (largest is None or n <= largest):
        out.append(n)
        n *= 2
    return out


def check_time(text: str) -> float:
    start = time.perf_counter()
    analyze_text(text, "bench.msl", REPO)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-r", "--rounds", type=int, default=3, help="timed runs per size")
    parser.add_argument("--smallest", type=int, default=2000)
    parser.add_argument("--largest", type=int, help="statements (default: up to 16 MiB)")
    parser.add_argument("--shape", choices=("chain", "unknown"), action="append")
    args = parser.parse_args(argv)
    worst = 0.0
    for shape in args.shape or ("chain", "unknown"):
        ns = sizes(shape, args.smallest, args.largest)
        texts = {n: spec(shape, n) for n in ns}
        times: dict[int, list[float]] = {n: [] for n in ns}
        check_time(texts[ns[0]])  # warm: the grammar tables and the op library
        for _ in range(args.rounds):
            for n in ns:
                times[n].append(check_time(texts[n]))
        print(f"{shape}: {args.rounds} rounds, interleaved")
        print(f"  {'statements':>10} {'MiB':>6} {'median s':>9} {'spread s':>9} {'us/stmt':>8}")
        per = {}
        for n in ns:
            med = statistics.median(times[n])
            per[n] = med / n
            mib = len(texts[n].encode()) / 2**20
            spread = max(times[n]) - min(times[n])
            print(
                f"  {n:>10} {mib:>6.2f} {med:>9.3f} {spread:>9.3f} {per[n] * 1e6:>8.1f}", flush=True
            )
        ratio = per[ns[-1]] / per[ns[0]]
        worst = max(worst, ratio)
        print(f"  time per statement, {ns[-1]} / {ns[0]}: {ratio:.2f} (target <= {TARGET})")
    return 0 if worst <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
