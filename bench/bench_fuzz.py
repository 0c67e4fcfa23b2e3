"""The fuzz campaigns.

    python bench/bench_fuzz.py [-n 10000] [--seed 0]
    python bench/bench_fuzz.py --files [-n 5000] [--seed 0] [--surfaces config,log.csv]
                               [--case I] [--keep DIR] [--seconds 20] [--memory-gib 2]

The spec campaign: N mutated and hostile specs (tests/mutations.py) through check,
estimate, fmt --check and compile, and random --set what-ifs over every mesh and
batch key, in-process. The file campaign (--files): N mutated config.json,
safetensors, index.json, source.json, strategy.json, run.json, log.csv and
calibration files and damaged run folders (tests/file_mutations.py) through import
hf, ckpt from-hf/to-hf/merge/reshard, report, calibrate and estimate --calibration,
each in a worker process that is killed past --seconds or --memory-gib
(tests/fuzz_guard.py).

Prints the cases per second, the cases per command and per exit status, and every
case that failed the oracle (past its time or memory, an undocumented exit status
or a traceback; for specs also generated code that does not compile or pass bash -n,
fmt changing the diagnostics) with how to run it again; exits 1 if any did.
`--case I` runs that one case and prints all it said; `--keep DIR` copies each
failing case's files to DIR/<I>/.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.file_mutations import (  # noqa: E402
    SEED_OF,
    SURFACES,
    Case,
    case_surface,
    keep_files,
    prepared,
)
from tests.file_seeds import Seeds  # noqa: E402
from tests.fuzz_guard import Guard  # noqa: E402
from tests.mutations import case, past_parsing, run  # noqa: E402


def summary(n: int, seed: int, seconds: float, groups: dict[str, Counter]) -> None:
    print(f"cases        {n} (seed {seed})")
    print(f"cases/s      {n / seconds:.1f}  ({seconds:.1f} s)")
    for name, counts in groups.items():
        print(f"{name:12} {dict(sorted(counts.items(), key=str))}")


def spec_campaign(args) -> int:
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
    summary(args.n, args.seed, seconds, {"by command": commands, "by exit": statuses})
    print(f"past parsing {parsed} ({parsed / args.n:.0%})")
    print(f"code written {written} of {compiles} compiles")
    print(f"failed       {len(crashes)}")
    return 1 if crashes else 0


def command_of(argv) -> str:
    return " ".join(argv[:2]) if argv[0] in ("ckpt", "import") else argv[0]


def described(seeds, seed: int, index: int, surfaces, keep: str | None, wrong):
    """The case a killed worker ran, made again (its files kept), or what stops that."""
    try:
        with prepared(seeds, seed, index, surfaces) as (case, work):
            if keep:
                keep_files(work, Path(keep) / str(index), f"{case}\n{wrong}\n")
            return case
    except Exception as exc:  # the fuzzer's own failure
        surface = case_surface(seed, index, surfaces)[1]
        return Case(seed, index, surface, "-", f"not made again: {exc!r}", ("-",))


def files_campaign(args) -> int:
    surfaces = tuple(args.surfaces.split(",")) if args.surfaces else SURFACES
    keep = str(Path(args.keep).resolve()) if args.keep else None
    indices = [args.case] if args.case is not None else range(args.n)
    only = f" --surfaces {args.surfaces}" if args.surfaces else ""  # a case is of its set
    with tempfile.TemporaryDirectory(prefix="msgen-fuzz-files-") as root:
        seeds = Seeds(Path(root) / "seeds")
        for name in sorted({SEED_OF[s] for s in surfaces}):
            seeds.folder(name)
        scratch = Path(root) / "scratch"  # what a killed case leaves is removed with it
        scratch.mkdir()
        os.environ["TMPDIR"] = str(scratch)
        guard = Guard("tests.file_mutations:guarded_case", args.seconds, args.memory_gib << 30)
        by_surface, by_command, statuses, failed = Counter(), Counter(), Counter(), 0
        took = Counter()
        began = time.perf_counter()
        for i in indices:
            start = time.perf_counter()
            done, result = guard.run(str(seeds.root), args.seed, i, surfaces, keep)
            if done:
                case, status, err, wrong = result
            else:
                status, err, wrong = "killed", "", [result]
                case = described(seeds, args.seed, i, surfaces, keep, wrong)
                for left in scratch.iterdir():
                    shutil.rmtree(left, ignore_errors=True)
            by_surface[case.surface] += 1
            took[case.surface] += time.perf_counter() - start
            by_command[command_of(case.argv)] += 1
            statuses[status] += 1
            if args.case is not None:
                print(f"{case}\nexit {status}\n{err}")
            if wrong:
                failed += 1
                said = [line for line in err.splitlines() if "internal error" in line]
                print(f"FAILED {case}: {wrong}\n  {(said or [err.strip()[-300:]])[0]}\n  again: python "
                      f"bench/bench_fuzz.py --files --seed {args.seed} --case {i}{only}",
                      file=sys.stderr, flush=True)  # fmt: skip
        seconds = time.perf_counter() - began
        guard.close()
    per_s = Counter({s: round(by_surface[s] / took[s], 1) for s in by_surface})
    groups = {"by surface": by_surface, "cases/s of": per_s, "by command": by_command,
              "by exit": statuses}  # fmt: skip
    summary(len(indices), args.seed, seconds, groups)
    print(f"workers      {guard.restarts} replaced")
    print(f"failed       {failed}")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=None, help="cases (default 10000, --files 5000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--files", action="store_true", help="the file campaign")
    parser.add_argument("--surfaces", help="--files: only these, comma-separated")
    parser.add_argument("--case", type=int, help="--files: run case I only, printing it")
    parser.add_argument("--keep", metavar="DIR", help="--files: copy failing cases here")
    parser.add_argument("--seconds", type=float, default=20, help="--files: per case (20)")
    parser.add_argument("--memory-gib", type=int, default=2, help="--files: per case (2)")
    args = parser.parse_args()
    if args.n is None:
        args.n = 5_000 if args.files else 10_000
    return files_campaign(args) if args.files else spec_campaign(args)


if __name__ == "__main__":
    sys.exit(main())
