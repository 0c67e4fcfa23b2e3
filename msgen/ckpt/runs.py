"""A run folder as train.py writes it: `rank_<r>/step_<N>.ckpt` (several per rank,
`keep` of them), each rank's `strategy.json`, and from-hf's `rank_<r>/model.ckpt`,
which counts as step 0.

MindSpore's transform tools take the last `*.ckpt` of each rank folder
(parallel/checkpoint_transform.py, `_transform_checkpoints`: glob, sort, the last one
wins), so a run is handed to them staged: one file per rank, all of the same step.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from msgen.base.status import UsageError

INIT_FILE = "model.ckpt"  # what from-hf writes and --init-from loads
SOURCE_FILE = "source.json"  # from-hf: the source config and each tensor's dtype
STRATEGY_FILE = "strategy.json"  # what each rank of a semi-auto run writes
_STEP = re.compile(r"step_(\d+)\.ckpt")
_RANK = re.compile(r"rank_(\d+)")


def rank_folders(run: Path) -> list[Path]:
    """rank_0 ... rank_<n-1> of `run`, or a usage error naming what is off."""
    if not run.is_dir():
        raise UsageError(f"{run} is not a folder")
    ranks = {int(m.group(1)): p for p in run.iterdir() if (m := _RANK.fullmatch(p.name))}
    if not ranks:
        raise UsageError(f"{run} holds no rank_<r> folder (not a run's --output?)")
    gaps = sorted(set(range(max(ranks) + 1)) - set(ranks))
    if gaps:
        raise UsageError(f"{run} has rank folders up to rank_{max(ranks)} but no rank_{gaps[0]}")
    return [ranks[r] for r in range(len(ranks))]


def steps_of(folder: Path) -> dict[int, Path]:
    """step -> checkpoint of one rank folder; from-hf's model.ckpt is step 0."""
    found = {
        int(m.group(1)): p for p in folder.glob("step_*.ckpt") if (m := _STEP.fullmatch(p.name))
    }
    if not found and (folder / INIT_FILE).is_file():
        found[0] = folder / INIT_FILE
    return found


def common_step(folders: list[Path]) -> tuple[int, list[Path]]:
    """The newest step every rank folder holds, with each rank's file of it."""
    steps = [steps_of(f) for f in folders]
    empty = [f for f, s in zip(folders, steps) if not s]
    if empty:
        raise UsageError(f"{empty[0]} holds no step_<N>.ckpt")
    common = set.intersection(*(set(s) for s in steps))
    if not common:
        first, other = steps[0], next(s for s in steps if not set(s) & set(steps[0]))
        at = steps.index(other)
        raise UsageError(
            f"the rank folders have no step in common: {folders[0].name} has "
            f"{_listed(first)}, {folders[at].name} has {_listed(other)}"
        )
    step = max(common)
    return step, [s[step] for s in steps]


def _listed(steps: dict[int, Path]) -> str:
    return ", ".join(str(s) for s in sorted(steps))


def run_strategies(folders: list[Path]) -> list[Path] | None:
    """Each rank's strategy.json, or None when no rank wrote one (a run of a
    data-parallel mesh, or slices written without them); some but not all is an error."""
    found = [f / STRATEGY_FILE for f in folders if (f / STRATEGY_FILE).is_file()]
    if found and len(found) != len(folders):
        missing = next(f for f in folders if not (f / STRATEGY_FILE).is_file())
        raise UsageError(f"{missing} has no {STRATEGY_FILE}, while other ranks have theirs")
    return found or None


def stage(files: list[Path], where: Path) -> Path:
    """`where/rank_<r>/` holding a link to rank r's file and nothing else."""
    for rank, file in enumerate(files):
        folder = where / f"rank_{rank}"
        folder.mkdir(parents=True)
        os.symlink(file.resolve(), folder / "staged.ckpt")
    return where
