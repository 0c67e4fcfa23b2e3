"""The fuzz campaign: N mutated and hostile specs (tests/mutations.py) through check,
estimate, fmt --check, compile --check and --set, in-process.

    python bench/bench_fuzz.py [-n 10000] [--seed 0]

Prints the cases per second, the cases per command and per exit status, and every
case that crashed (exit 70 or a traceback); exits 1 if any did.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.mutations import case, crashed, run  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=10_000, help="cases (default 10000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rnd = random.Random(args.seed)
    commands, statuses, crashes = Counter(), Counter(), []
    began = time.perf_counter()
    for i in range(args.n):
        name, text, command = case(rnd)
        status, err = run(name, text, command)
        commands[command[0] if command[0] != "estimate" or "--set" not in command else "--set"] += 1
        statuses[status] += 1
        if crashed(status, err):
            crashes.append((i, name, command, err[-400:]))
            print(f"CRASH case {i}: {name} {' '.join(command)}\n{err[-400:]}", file=sys.stderr)
    seconds = time.perf_counter() - began
    print(f"cases        {args.n} (seed {args.seed})")
    print(f"cases/s      {args.n / seconds:.1f}  ({seconds:.1f} s)")
    print(f"by command   {dict(sorted(commands.items()))}")
    print(f"by exit      {dict(sorted(statuses.items()))}")
    print(f"crashes      {len(crashes)}")
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
