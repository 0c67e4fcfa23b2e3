"""`msgen import hf` of a 128-expert model against a dense 8B, in one run: the time of
Qwen3-30B-A3B's published config (48 layers of 128 experts) over Meta-Llama-3-8B's
(tests/hf_configs), each in a fresh process, the two interleaved.

    python bench/bench_import_hf.py [-n 5] [--devices 16]

Without `--devices` the import reads the config, writes the spec and analyses it once;
with it the planner also searches the layouts (ep among them for the experts). Prints
the median and spread (min..max) of each and the ratio of the medians, with its target
(below TARGET).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "tests" / "hf_configs"
MODELS = {"128 experts (Qwen3-30B-A3B)": "qwen3_30b_a3b", "dense 8B (Llama-3-8B)": "llama3_8b"}
TARGET = 2.0


def timed(config: Path, out: Path, devices: int | None) -> float:
    """One `msgen import hf` in a fresh process, wall time from start to exit."""
    argv = [sys.executable, "-m", "msgen.cli", "import", "hf", str(config), "-o", str(out)]
    argv += ["--force"] + (["--devices", str(devices)] if devices else [])
    start = time.perf_counter()
    subprocess.run(argv, cwd=REPO, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=5, help="runs of each (default 5)")
    parser.add_argument("--devices", type=int, default=None, help="plan for this many devices")
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in MODELS}
    with tempfile.TemporaryDirectory() as tmp:
        folders = {}
        for name, file in MODELS.items():  # the spec is named after the config's folder
            folder = Path(tmp) / file
            folder.mkdir()
            (folder / "config.json").write_bytes((CONFIGS / f"{file}.json").read_bytes())
            folders[name] = folder
        for _ in range(args.n):
            for name, folder in folders.items():
                times[name].append(timed(folder / "config.json", folder / "m.msl", args.devices))
    medians = {}
    for name, values in times.items():
        medians[name] = statistics.median(values)
        print(f"{name}: {medians[name]:.2f} s ({min(values):.2f}..{max(values):.2f})")
    moe, dense = medians.values()
    print(f"ratio: {moe / dense:.2f} (target < {TARGET})")


if __name__ == "__main__":
    main()
