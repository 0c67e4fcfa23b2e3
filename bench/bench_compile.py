"""How does `msgen compile` grow from gpt7b (32 layers, 8 devices) to the same model at
256 layers on 4096 devices (512 nodes, dp = 64, tp = 8, pp = 8)?

    python bench/bench_compile.py [-n 5]

The large spec is gpt7b.msl with its counts changed, written to a scratch folder:
layers = 256, 512 nodes each with 8 distinct device IPs, the mesh above,
micro_batches = 64 (>= pp) and global_batch = micro_batch * dp * micro_batches.
Each spec is timed N times after one untimed warm-up, two ways: the command as a
user runs it (`msgen compile SPEC -o DIR`, process start included, into a fresh
folder each run), and its phases in this process (read + parse + check, then
plan + emit, then write). Prints the medians and the ratios large / gpt7b.

Nothing expands the repeated layers (plan.json lists their parameters as runs;
bench/bench_layers.py shows compile flat in the layer count); emitting writes one
rank-table entry per device, so compile grows with the devices, where check does not.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BASE = REPO / "specs" / "gpt7b.msl"
LAYERS, NODES, PER_NODE = 256, 512, 8
DP, TP, PP = 64, 8, 8
MICRO_BATCHES = 64


def msgen_command() -> list[str]:
    script = Path(sys.executable).parent / "msgen"
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from msgen.cli import main; sys.exit(main())"]


def _set(text: str, key: str, value: str) -> str:
    """Replace the value of `key = ...` (one line, comment dropped); the key must exist."""
    new, count = re.subn(rf"(?m)^(\s*{key}\s*=\s*).*$", rf"\g<1>{value}", text)
    if count != 1:
        raise SystemExit(f"bench: {BASE.name} has {count} lines `{key} = ...`, expected 1")
    return new


def scaled_spec() -> str:
    """gpt7b.msl at LAYERS layers on NODES x PER_NODE devices."""
    nodes = [f"10.0.{i // 256}.{i % 256}" for i in range(NODES)]
    device_ips = [
        [f"10.{1 + d}.{i // 256}.{i % 256}" for d in range(PER_NODE)] for i in range(NODES)
    ]
    assert len({ip for ips in device_ips for ip in ips}) == NODES * PER_NODE
    text = BASE.read_text()
    # device_ips spans several lines in gpt7b.msl (its comment continues): drop them all.
    text = re.sub(r"(?m)^\s*device_ips\s*=.*\n(\s*#.*\n)*", "", text)
    text = _set(text, "layers", str(LAYERS))
    text = _set(text, "per_node", str(PER_NODE))
    node_list = ", ".join(f'"{ip}"' for ip in nodes)
    ip_lists = ",\n        ".join(
        "[" + ", ".join(f'"{ip}"' for ip in ips) + "]" for ips in device_ips
    )
    text = _set(text, "nodes", f"[{node_list}]\n    device_ips = [\n        {ip_lists}\n    ]")
    text = _set(text, "dp", str(DP))
    text = _set(text, "tp", str(TP))
    text = _set(text, "pp", str(PP))
    text = _set(text, "micro_batches", str(MICRO_BATCHES))
    micro_batch = int(re.search(r"(?m)^\s*micro_batch\s*=\s*(\d+)", text).group(1))
    text = _set(text, "global_batch", str(micro_batch * DP * MICRO_BATCHES))
    return text


def command_times(spec: Path, out: Path, runs: int) -> list[float]:
    times = []
    for i in range(runs + 1):
        shutil.rmtree(out, ignore_errors=True)
        start = time.perf_counter()
        proc = subprocess.run(
            [*msgen_command(), "compile", str(spec), "-o", str(out)],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        elapsed = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(
                f"bench: msgen compile {spec} exited {proc.returncode}:\n{proc.stderr}"
            )
        if i:  # the first run warms caches and writes bytecode
            times.append(elapsed)
    return times


def phase_times(spec: Path, out: Path, runs: int) -> dict[str, list[float]]:
    """check (read, parse, lower, checks), emit (plan and every file's text), write."""
    from msgen.analysis.plan import build_plan
    from msgen.base.tree import write_tree
    from msgen.compiler import analyze
    from msgen.emit import emit

    times: dict[str, list[float]] = {"check": [], "emit": [], "write": []}
    for i in range(runs + 1):
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        result = analyze(spec)
        assert result.ok, [d.message for d in result.diagnostics]
        t1 = time.perf_counter()
        files = emit(build_plan(result.spec, result.facts), result.file)
        t2 = time.perf_counter()
        write_tree(out / result.spec.model.name, files, force=True)
        t3 = time.perf_counter()
        if i:
            for key, took in zip(times, (t1 - t0, t2 - t1, t3 - t2)):
                times[key].append(took)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--runs", type=int, default=5, help="timed runs per spec")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")

    with tempfile.TemporaryDirectory(prefix="msgen-bench-") as scratch:
        scratch = Path(scratch)
        large = scratch / "gpt7b_256x4096.msl"
        large.write_text(scaled_spec())
        specs = {
            "gpt7b (32 layers, 8 devices)": BASE,
            f"gpt7b ({LAYERS} layers, {NODES * PER_NODE} devices)": large,
        }
        print(f"{args.runs} runs each (median), {sys.executable}")
        header = f"{'spec':<36} {'command':>9} {'check':>8} {'emit':>8} {'write':>8}  output"
        print(header)
        medians = {}
        for label, spec in specs.items():
            out = scratch / "out"
            command = statistics.median(command_times(spec, out, args.runs))
            phases = {k: statistics.median(v) for k, v in phase_times(spec, out, args.runs).items()}
            size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
            medians[label] = (command, phases)
            print(
                f"{label:<36} {command:>8.2f}s {phases['check']:>7.3f}s {phases['emit']:>7.3f}s "
                f"{phases['write']:>7.3f}s  {size / 2**20:.1f} MiB"
            )
        (small, small_phases), (big, big_phases) = medians.values()
        ratios = "  ".join(
            f"{k} x{big_phases[k] / small_phases[k]:.1f}" for k in ("check", "emit", "write")
        )
        print(f"ratio large / gpt7b: command x{big / small:.2f};  {ratios}")
        print(f"(the large spec: layers x{LAYERS // 32}, devices x{NODES * PER_NODE // 8})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
