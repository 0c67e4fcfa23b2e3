"""Does `msgen compile` stay flat as `layers` grows? gpt7b.msl at 32, 1,000, 100,000
and 2^40 - 1 layers (the largest dim msgen allows; the budget raised so that they
compiles), each timed N times after one untimed warm-up, in this process:

    python bench/bench_layers.py [-n 5]

Prints per layer count the median of check (read, parse, lower, checks), emit (plan
and every file's text) and write, the bytes written and plan.json's bytes, and the
ratios to 32 layers. Repeated layers are never expanded (plan.json lists their
parameters as runs), so the ratios stay near 1.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from bench_compile import BASE, _set, phase_times

LAYERS = (32, 1_000, 100_000, 2**40 - 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--runs", type=int, default=5, help="timed runs per spec")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="msgen-bench-") as scratch:
        scratch = Path(scratch)
        (scratch / "hccn.conf").write_bytes((BASE.parent / "hccn.conf").read_bytes())
        print(f"{args.runs} runs each (median), {sys.executable}")
        print(
            f"{'layers':>14} {'check':>8} {'emit':>8} {'write':>8} {'output':>10} {'plan.json':>10}"
        )
        first = None
        for layers in LAYERS:
            spec = scratch / f"gpt7b_{layers}.msl"
            text = _set(BASE.read_text(), "layers", str(layers))
            spec.write_text(_set(text, "device_memory", "1e12 TB"))
            out = scratch / "out"
            phases = {k: statistics.median(v) for k, v in phase_times(spec, out, args.runs).items()}
            size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
            plan = (out / "gpt7b" / "plan.json").stat().st_size
            first = first or (phases, size)
            print(
                f"{layers:>14,} {phases['check']:>7.3f}s {phases['emit']:>7.3f}s "
                f"{phases['write']:>7.3f}s {size:>10,} {plan:>10,}"
            )
        base, base_size = first
        ratios = "  ".join(f"{k} x{phases[k] / base[k]:.2f}" for k in ("check", "emit", "write"))
        print(f"ratio {LAYERS[-1]:,} / 32 layers: {ratios};  bytes x{size / base_size:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
