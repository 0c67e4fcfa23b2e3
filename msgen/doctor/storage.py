"""The host's disk and memory for this node's ranks: room for `keep` checkpoints, a
writable output folder, and host memory to stage a checkpoint while it is written.

A rank's checkpoint holds its weights and optimizer states (master copy and Adam
moments): the estimate's `weights_bytes + optimizer_bytes` for its stage. Below
zero = 3 the estimate counts weights whole, so this is an upper bound there.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from msgen.doctor.result import Check, error, ok, skipped, warning

GiB = 2**30


def gib(n: int | float) -> str:
    """A size in GiB, or in MiB below one GiB (a tiny model's checkpoint is not 0.0 GiB)."""
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / 2**20:.1f} MiB"


def checkpoint_bytes(stage_bytes: Sequence[int], ranks: Sequence[int], ranks_per_stage: int) -> int:
    """One checkpoint of each of `ranks`, from its stage's per-device figure."""
    return sum(stage_bytes[rank // ranks_per_stage] for rank in ranks)


def existing_parent(path: Path) -> Path:
    """`path` or its nearest ancestor that exists (where it would be created)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def output_checks(output: Path, one_checkpoint: int, keep: int) -> list[Check]:
    """The folder can be written and its disk holds `keep` checkpoints of the node."""
    here = existing_parent(output)
    if not here.is_dir():
        return [error("output", f"{output}: {here} is a file, not a folder",
                      "pass train.py another --output folder")]  # fmt: skip
    if not os.access(here, os.W_OK | os.X_OK):
        return [error("output", f"{output}: cannot write in {here}",
                      "make it writable for this user, or pass train.py another --output")]  # fmt: skip
    need = one_checkpoint * keep
    free = shutil.disk_usage(here).free
    if free < need:
        return [error("disk", f"{here} has {gib(free)} free; {keep} checkpoints of this node's ranks "
                      f"take {gib(need)}", "free disk space, lower train.checkpoint's keep, or "
                      "write --output to a larger disk")]  # fmt: skip
    return [
        ok(
            "disk",
            f"{output}: writable, {gib(free)} free for {keep} checkpoint(s) of {gib(one_checkpoint)}",
        )
    ]


def available_memory(meminfo: str) -> int | None:
    """MemAvailable of /proc/meminfo, in bytes."""
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def memory_checks(meminfo: str | None, one_checkpoint: int) -> list[Check]:
    """Each rank stages its checkpoint in host memory while writing it, all at once."""
    available = available_memory(meminfo) if meminfo else None
    if available is None:
        return [skipped("memory", "no /proc/meminfo on this host")]
    if available < one_checkpoint:
        return [error("memory", f"{gib(available)} of host memory available; writing a checkpoint "
                      f"stages {gib(one_checkpoint)} across this node's ranks",
                      "stop what holds the memory, or run fewer ranks per node")]  # fmt: skip
    if available < 2 * one_checkpoint:
        return [warning("memory", f"{gib(available)} of host memory available: little beyond the "
                        f"{gib(one_checkpoint)} a checkpoint stages, with the data pipeline on top",
                        "free host memory before a long run")]  # fmt: skip
    return [
        ok(
            "memory",
            f"{gib(available)} of host memory available ({gib(one_checkpoint)} per checkpoint)",
        )
    ]
