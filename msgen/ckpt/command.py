"""`msgen ckpt merge SPEC RUN -o FILE` and `msgen ckpt reshard SPEC RUN --set ... -o DIR`.

The run's newest step that every rank folder holds is staged one file per rank, its
strategy files (the run's own, else those `msgen compile` writes for the spec) merged
over the pipeline stages, and MindSpore's transform_checkpoints (msgen.ckpt.transform)
makes the whole checkpoint, or every rank's slices for the mesh the spec has after
`--set`. Weights and optimizer moments alike: a resharded folder is a run folder
train.py continues with `--resume`. Every tensor written is held against the spec
first; the output appears whole or not at all.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from msgen.base.files import new_file_mode
from msgen.base.status import EXIT_OK, UsageError
from msgen.ckpt.expected import (
    check_tensors,
    expected_strategies,
    spec_params,
    stage_layouts,
    with_moments,
)
from msgen.ckpt.runs import (
    INIT_FILE,
    SOURCE_FILE,
    STRATEGY_FILE,
    common_step,
    rank_folders,
    run_strategies,
    stage,
)
from msgen.ckpt.slices import LayoutError, slice_shape
from msgen.ckpt.transform import load, merged_strategy, transform


@dataclass(frozen=True)
class TransformOptions:
    spec: Path
    run: Path
    output: Path
    force: bool = False


@dataclass(frozen=True)
class Source:
    step: int
    files: list[Path]  # one per rank (one whole file when `strategy` is None)
    strategy: dict[str, str | Path] | None  # flat name -> strategy text or file


def read_source(result, spec: Path, run: Path) -> Source:
    """The run's newest common step and the strategy files that describe its slices."""
    if (run / INIT_FILE).is_file() and not any(run.glob("rank_*")):
        return Source(0, [run / INIT_FILE], None)  # from-hf's whole checkpoint
    folders = rank_folders(run)
    step, files = common_step(folders)
    own = run_strategies(folders)
    if own is not None:
        return Source(step, files, {f"{p.parent.name}.json": p for p in own})
    expected = expected_strategies(result, spec)
    mesh = result.spec.mesh
    world = mesh.dp * mesh.tp * mesh.pp
    if expected and len(folders) != world:
        raise UsageError(
            f"{run} has {len(folders)} rank folders and no strategy files; the spec's "
            f"mesh has {world} ranks"
        )
    # a data-parallel run: every rank holds the whole model
    return Source(step, files if expected else files[:1], expected or None)


@contextmanager
def scratch(beside: Path):
    """A folder of msgen's own next to the output (the same file system, so the result
    moves into place by renaming), removed afterwards whatever happens."""
    beside.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=".msgen-ckpt-", dir=beside))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _shapes(saved: dict) -> dict[str, tuple[int, ...]]:
    return {name: tuple(p.shape) for name, p in saved.items()}


def _transformed(source: Source, work: Path, target: dict[str, str] | None) -> dict[int, Path]:
    """rank -> checkpoint under the target strategy files (None: one whole checkpoint)."""
    if source.strategy is None and target is None:
        return {0: source.files[0]}
    src = merged_strategy(source.strategy, work / "src") if source.strategy else None
    dst = merged_strategy(target, work / "dst") if target else None
    return transform(stage(source.files, work / "staged"), work / "out", src, dst)


def whole_checkpoint(result, spec: Path, run: Path, work: Path) -> tuple[int, Path]:
    """(step, file) of the run's newest common step as one whole checkpoint: the file
    itself when it is whole, else merged under `work`."""
    source = read_source(result, spec, run)
    (path,) = _transformed(source, work, None).values()
    return source.step, path


def _refuse_overwrite(options: TransformOptions) -> None:
    if options.output.resolve() == options.run.resolve():
        raise UsageError(f"-o {options.output} is the run itself: name another output")


def merge_command(result, options: TransformOptions) -> int:
    _refuse_overwrite(options)
    out = options.output
    if out.is_dir():
        raise UsageError(f"-o {out} is a folder; merge writes one checkpoint file")
    if out.exists() and not options.force:
        raise UsageError(f"-o {out} exists; add --force to replace it")
    with scratch(out.parent) as work:
        step, merged = whole_checkpoint(result, options.spec, options.run, work)
        check_tensors(_shapes(load(merged)), with_moments(spec_params(result)), str(options.run))
        staged = work / "merged.ckpt"
        shutil.copyfile(merged, staged)
        os.chmod(staged, new_file_mode())
        os.replace(staged, out)
    print(f"wrote {out}: step {step} of {options.run}, merged", file=sys.stderr)
    return EXIT_OK


def _rank_shapes(logical: dict, layouts: dict) -> dict[str, tuple[int, ...]]:
    """The slice shape of each tensor a rank of this stage holds."""
    try:
        return {n: slice_shape(logical[n], layout) for n, layout in layouts.items() if n in logical}
    except LayoutError as exc:
        raise UsageError(f"the target mesh cannot hold the spec's tensors: {exc}") from exc


def reshard_command(source_result, target_result, options: TransformOptions) -> int:
    """The run of the spec (`source_result`, as written) resharded for the mesh of
    `target_result` (the spec after --set)."""
    _refuse_overwrite(options)
    out = options.output
    if out.exists() and not out.is_dir():
        raise UsageError(f"-o {out} is not a folder")
    if out.is_dir() and any(out.iterdir()) and not options.force:
        raise UsageError(f"-o {out} is not empty; add --force to write into it")
    source = read_source(source_result, options.spec, options.run)
    stages = stage_layouts(target_result, options.spec)
    target = {f"stage_{s}.json": stage.text for s, stage in enumerate(stages)} or None
    logical = with_moments(spec_params(target_result))
    name = INIT_FILE if source.files[0].name == INIT_FILE else f"step_{source.step:08d}.ckpt"
    mesh = target_result.spec.mesh
    with scratch(out.parent) as work:
        made = _transformed(source, work, target)
        ready = work / "ready"
        ranks = range(mesh.dp * mesh.tp * mesh.pp) if target else range(mesh.dp)
        for rank in ranks:
            folder = ready / f"rank_{rank}"
            folder.mkdir(parents=True)
            file = made[rank if target else 0]
            want = logical
            if target:
                stage = stages[rank // stages[0].devices]
                want = _rank_shapes(logical, stage.layouts)
                (folder / STRATEGY_FILE).write_text(stage.text, encoding="utf-8")
            check_tensors(_shapes(load(file)), want, f"rank {rank}")
            shutil.copyfile(file, folder / name)
        if (options.run / SOURCE_FILE).is_file():
            shutil.copyfile(options.run / SOURCE_FILE, ready / SOURCE_FILE)
        _move_in(ready, out)
    print(f"wrote {out}: step {source.step} for {len(ranks)} ranks", file=sys.stderr)
    return EXIT_OK


def _move_in(ready: Path, out: Path) -> None:
    """Every file of `ready` to its place under `out`, each by renaming (a new `out`
    by one rename)."""
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
    if not out.exists():
        os.replace(ready, out)
        return
    for path in sorted(ready.rglob("*")):
        if path.is_file():
            dest = out / path.relative_to(ready)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, dest)
