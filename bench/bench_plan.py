"""How fast does `msgen plan` search? Prints, per spec, the layouts searched
(passing every check but the budget), how many fit, the median time of the
search over N runs, and layouts per second.

    python bench/bench_plan.py [-n 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SPECS = {
    "gpt7b (8 devices)": "specs/gpt7b.msl",
    "llama13b (16 devices)": "specs/llama13b.msl",
    "gpt1t (4096 devices)": "specs/validation/gpt1t_4096.msl",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--runs", type=int, default=3, help="timed runs per spec")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    sys.path.insert(0, str(REPO))
    from msgen.compiler import analyze
    from msgen.estimate.planner import search

    print(f"{args.runs} runs each, median, {sys.executable}")
    print(f"{'spec':<24} {'searched':>9} {'fit':>6} {'time':>9} {'layouts/s':>10}")
    for name, spec in SPECS.items():
        result = analyze(REPO / spec)
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            found = search(result.spec, result.facts)
            times.append(time.perf_counter() - start)
        t = statistics.median(times)
        print(f"{name:<24} {found.searched:>9,} {found.fitting:>6,} {t:>8.2f}s "
              f"{found.searched / t:>10,.0f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
