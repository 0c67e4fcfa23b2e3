"""The host's disk and memory for this node's ranks: room for `keep` checkpoints, a
writable output folder, and host memory to stage a checkpoint while it is written.

A rank's checkpoint is what train.py saves: each parameter of its stage as the rank
holds it and its two Adam moments (clones of it, msgen.ckpt.expected.MOMENTS) in the
stored dtype, and the step counters and loss scale (STATE). The slice is the one the
compiled tree's strategy files give (its plan.json laid out by msgen.emit.strategy:
tp, ep and the parallel optimizer's dp shard); in data-parallel mode every rank holds
the whole model. That is exact but for MindSpore's framing of each tensor, counted
here from above. Without a compiled tree of the spec the size is the estimate's
`weights_bytes + optimizer_bytes`, which counts a gathered copy of each ZeRO-sharded
weight and fp32 moments: an upper bound (3.6x the real need at dp 8, zero 1), so a
shortfall against it is a warning, not an error.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from math import prod
from pathlib import Path

from msgen.ckpt.expected import MOMENTS, STATE
from msgen.ckpt.slices import LayoutError, slice_shape
from msgen.doctor.result import Check, error, ok, skipped, warning
from msgen.emit.strategy import Unsupported, layout, parameters
from msgen.ir.mesh import RankMesh
from msgen.ir.schema import DTYPE_BYTES, Dtype

GiB = 2**30
# A tensor's bytes in a MindSpore 2.10 checkpoint beyond its data and its name (the
# protobuf Checkpoint's value: tag, dims, dtype string): 23-24 measured, counted as 32.
FRAMING_BYTES = 32
SCALAR_BYTES = 8  # the widest of STATE's one-element tensors (step, int64)


def gib(n: int | float) -> str:
    """A size in GiB, or in MiB below one GiB (a tiny model's checkpoint is not 0.0 GiB)."""
    return f"{n / GiB:.1f} GiB" if n >= GiB else f"{n / 2**20:.1f} MiB"


def stage_checkpoint_bytes(plan: dict, semi_auto: bool) -> list[int] | None:
    """The checkpoint one rank of each pipeline stage writes, from the compiled tree's
    plan.json; None when plan.json does not say (not one msgen wrote)."""
    try:
        itemsize = DTYPE_BYTES[Dtype(plan["estimate"]["dtypes"]["weights"])]
        out = [0] * plan["mesh"]["pp"]
        mesh = RankMesh.of_plan(plan)
        for p in parameters(plan):
            shape = slice_shape(p["shape"], layout(p, plan, mesh)) if semi_auto else p["shape"]
            data = prod(shape) * itemsize + FRAMING_BYTES
            size = sum(data + len(prefix + p["path"]) for prefix in ("", *MOMENTS))
            for stage in p["stages"]:
                out[stage] += size
    except (KeyError, TypeError, ValueError, IndexError, LayoutError, Unsupported):
        return None
    state = sum(SCALAR_BYTES + FRAMING_BYTES + len(name) for name in STATE)
    return [size + state for size in out]


def checkpoint_bytes(stage_bytes: Sequence[int], ranks: Sequence[int], mesh: RankMesh) -> int:
    """One checkpoint of each of `ranks`, from its stage's per-device figure."""
    return sum(stage_bytes[mesh.stage_of(rank)] for rank in ranks)


def existing_parent(path: Path) -> Path:
    """`path` or its nearest ancestor that exists (where it would be created)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


BOUND = "at most "  # how a size that is only a bound is shown
NO_TREE = (
    "an upper bound: no tree compiled from this spec (with these --set flags) to size them "
    "exactly"
)


def output_checks(output: Path, one_checkpoint: int, keep: int, exact: bool) -> list[Check]:
    """The folder can be written and its disk holds `keep` checkpoints of the node:
    an error when it does not, a warning when it may not (the size is a bound)."""
    here = existing_parent(output)
    if not here.is_dir():
        return [error("output", f"{output}: {here} is a file, not a folder",
                      "pass train.py another --output folder")]  # fmt: skip
    if not os.access(here, os.W_OK | os.X_OK):
        return [error("output", f"{output}: cannot write in {here}",
                      "make it writable for this user, or pass train.py another --output")]  # fmt: skip
    need = one_checkpoint * keep
    free = shutil.disk_usage(here).free
    bound = "" if exact else BOUND
    fix = "free disk space, lower train.checkpoint's keep, or write --output to a larger disk"
    if free < need and exact:
        return [error("disk", f"{here} has {gib(free)} free; {keep} checkpoints of this node's ranks "
                      f"take {gib(need)}", fix)]  # fmt: skip
    if free < need:
        return [warning("disk", f"{here} has {gib(free)} free; {keep} checkpoints of this node's "
                        f"ranks take {BOUND}{gib(need)} ({NO_TREE})",
                        f"compile the spec (msgen compile) and pass --tree, or {fix}")]  # fmt: skip
    return [
        ok(
            "disk",
            f"{output}: writable, {gib(free)} free for {keep} checkpoint(s) of "
            f"{bound}{gib(one_checkpoint)}",
        )
    ]


def available_memory(meminfo: str) -> int | None:
    """MemAvailable of /proc/meminfo, in bytes."""
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def memory_checks(meminfo: str | None, one_checkpoint: int, exact: bool) -> list[Check]:
    """Each rank stages its checkpoint in host memory while writing it, all at once."""
    available = available_memory(meminfo) if meminfo else None
    if available is None:
        return [skipped("memory", "no /proc/meminfo on this host")]
    if available < one_checkpoint and not exact:
        return [warning("memory", f"{gib(available)} of host memory available; writing a checkpoint "
                        f"stages {BOUND}{gib(one_checkpoint)} across this node's ranks ({NO_TREE})",
                        "compile the spec (msgen compile) and pass --tree, or free host memory")]  # fmt: skip
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
            f"{gib(available)} of host memory available ({'' if exact else BOUND}"
            f"{gib(one_checkpoint)} per checkpoint)",
        )
    ]
