"""The fuzz campaign: N mutated and hostile specs (tests/mutations.py) through check,
estimate, fmt --check and compile, and random --set what-ifs over every mesh and
batch key, in-process.

    python bench/bench_fuzz.py [-n 10000] [--seed 0]

Prints the cases per second, the cases per command and per exit status, how many
got past the parser and how many compiles wrote code, and every case that failed
the oracle (past its time, an undocumented exit status or a traceback, generated
code that does not compile or pass bash -n, fmt changing the diagnostics); exits
1 if any did.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.mutations import case, past_parsing, run  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=10_000, help="cases (default 10000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rnd = random.Random(args.seed)
    commands, statuses, crashes = Counter(), Counter(), []
    parsed = written = compiles = 0
    began = time.perf_counter()
    for i in range(args.n):
        name, text, command = case(rnd)
        status, err, wrong = run(name, text, command)
        commands[command[0] + (" --set" if "--set" in command else "")] += 1
        statuses[status] += 1
        parsed += past_parsing(err)
        compiles += command[0] == "compile"
        written += command[0] == "compile" and status == 0
        if wrong:
            crashes.append((i, name, command, wrong))
            print(f"FAILED case {i}: {name} {' '.join(command)[:300]}: {wrong}\n{err[-400:]}",
                  file=sys.stderr)  # fmt: skip
    seconds = time.perf_counter() - began
    print(f"cases        {args.n} (seed {args.seed})")
    print(f"cases/s      {args.n / seconds:.1f}  ({seconds:.1f} s)")
    print(f"by command   {dict(sorted(commands.items()))}")
    print(f"by exit      {dict(sorted(statuses.items()))}")
    print(f"past parsing {parsed} ({parsed / args.n:.0%})")
    print(f"code written {written} of {compiles} compiles")
    print(f"failed       {len(crashes)}")
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
