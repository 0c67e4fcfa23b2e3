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
import stat
from pathlib import Path

from msgen.base.status import UsageError
from msgen.diagnostics import printable

INIT_FILE = "model.ckpt"  # what from-hf writes and --init-from loads
SOURCE_FILE = "source.json"  # from-hf: the source config and each tensor's dtype
STRATEGY_FILE = "strategy.json"  # what each rank of a semi-auto run writes
_STEP = re.compile(r"step_([0-9]+)\.ckpt", re.ASCII)
_RANK = re.compile(r"rank_([0-9]+)", re.ASCII)


def _shown(path: Path) -> str:
    return printable(str(path))


def rank_folders(run: Path) -> list[Path]:
    """rank_0 ... rank_<n-1> of `run`, or a usage error naming what is off. The ranks
    are counted, never enumerated up to the largest number (a folder `rank_100000000`
    costs what any other does)."""
    if not run.is_dir():
        raise UsageError(f"{_shown(run)} is not a folder")
    ranks = {}
    for path in run.iterdir():
        if not (m := _RANK.fullmatch(path.name)):
            continue
        if m.group(1) != str(int(m.group(1))):  # train.py never writes rank_01
            raise UsageError(f"{_shown(path)} is not a rank folder train.py writes (rank_<r>)")
        if not path.is_dir():
            raise UsageError(f"{_shown(path)} is {what_it_is(path)}, not a rank folder")
        ranks[int(m.group(1))] = path
    if not ranks:
        raise UsageError(f"{_shown(run)} holds no rank_<r> folder (not a run's --output?)")
    order = sorted(ranks)
    if order[-1] != len(order) - 1:
        gap = next(at for at, rank in enumerate(order) if at != rank)
        raise UsageError(
            f"{_shown(run)} has {len(order)} rank folders, up to rank_{order[-1]}: "
            f"no rank_{gap}"
        )
    return [ranks[r] for r in order]


def what_it_is(path: Path) -> str:
    """What a path is, for a message: 'a regular file', 'a FIFO', ..."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    kinds = (
        (stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )  # fmt: skip
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def steps_of(folder: Path) -> dict[int, Path]:
    """step -> checkpoint of one rank folder; from-hf's model.ckpt is step 0. Two files
    of one step (step_5.ckpt beside step_00000005.ckpt) are refused, not one picked."""
    found: dict[int, Path] = {}
    for path in sorted(folder.glob("step_*.ckpt")):
        if not (m := _STEP.fullmatch(path.name)):
            continue
        step = int(m.group(1))
        if step in found:
            raise UsageError(f"{_shown(folder)} has two files of step {step}: "
                             f"{found[step].name} and {path.name}")  # fmt: skip
        found[step] = path
    if not found and (folder / INIT_FILE).exists():
        found[0] = folder / INIT_FILE
    return found


def common_step(folders: list[Path]) -> tuple[int, list[Path]]:
    """The newest step every rank folder holds, with each rank's file of it."""
    steps = [steps_of(f) for f in folders]
    empty = [f for f, s in zip(folders, steps) if not s]
    if empty:
        raise UsageError(f"{_shown(empty[0])} holds no step_<N>.ckpt")
    common = set.intersection(*(set(s) for s in steps))
    if not common:
        first, other = steps[0], next(s for s in steps if not set(s) & set(steps[0]))
        at = steps.index(other)
        raise UsageError(
            f"the rank folders have no step in common: {folders[0].name} has "
            f"{_listed(first)}, {folders[at].name} has {_listed(other)}"
        )
    step = max(common)
    files = [s[step] for s in steps]
    for file in files:
        kind = what_it_is(file)
        if kind != "a regular file":
            raise UsageError(f"{_shown(file)} is {kind}, not a checkpoint file")
    return step, files


def _listed(steps: dict[int, Path]) -> str:
    return ", ".join(str(s) for s in sorted(steps))


def run_strategies(folders: list[Path]) -> list[Path] | None:
    """Each rank's strategy.json, or None when no rank wrote one (a run of a
    data-parallel mesh, or slices written without them); some but not all is an error."""
    found = [f / STRATEGY_FILE for f in folders if (f / STRATEGY_FILE).is_file()]
    if found and len(found) != len(folders):
        missing = next(f for f in folders if not (f / STRATEGY_FILE).is_file())
        raise UsageError(f"{_shown(missing)} has no {STRATEGY_FILE}, while other ranks have theirs")
    return found or None


def stage(files: list[Path], where: Path) -> Path:
    """`where/rank_<r>/` holding a link to rank r's file and nothing else."""
    for rank, file in enumerate(files):
        folder = where / f"rank_{rank}"
        folder.mkdir(parents=True)
        os.symlink(file.resolve(), folder / "staged.ckpt")
    return where
