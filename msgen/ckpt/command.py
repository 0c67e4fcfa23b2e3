"""`msgen ckpt merge SPEC RUN -o FILE` and `msgen ckpt reshard SPEC RUN --set ... -o DIR`.

The run's newest step that every rank folder holds is staged one file per rank, its
strategy files (the run's own, else those `msgen compile` writes for the spec) merged
over the pipeline stages, and MindSpore's transform_checkpoints (msgen.ckpt.transform)
makes the whole checkpoint, or every rank's slices for the mesh the spec has after
`--set`. Weights and optimizer moments alike: a resharded folder is a run folder
train.py continues with `--resume`. Every tensor written is held against the spec
first; the output appears whole or not at all, and only for one writer at a time
(msgen.ckpt.output).
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from msgen.base.status import EXIT_OK
from msgen.ckpt.ckptfile import tensor_shapes
from msgen.ckpt.expected import (
    check_tensors,
    rank_shapes,
    spec_tensors,
    stage_layouts,
)
from msgen.ckpt.output import RUN_FORMS, Forms, claim
from msgen.ckpt.runs import INIT_FILE, SOURCE_FILE, STRATEGY_FILE, stage
from msgen.ckpt.source import Source, read_source
from msgen.ckpt.transform import merged_strategy, transform
from msgen.diagnostics import printable
from msgen.ir.mesh import RankMesh


@dataclass(frozen=True)
class TransformOptions:
    spec: Path
    run: Path
    output: Path
    force: bool = False


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


def merge_command(result, options: TransformOptions) -> int:
    out = options.output
    with claim(out, {"the run": options.run}, options.force, None) as held:
        step, merged = whole_checkpoint(result, options.spec, options.run, held.work)
        check_tensors(tensor_shapes(merged), spec_tensors(result), "merged")
        shutil.copyfile(merged, held.staged)
    print(f"wrote {printable(str(out))}: step {step} of {printable(str(options.run))}, merged",
          file=sys.stderr)  # fmt: skip
    return EXIT_OK


def reshard_command(source_result, target_result, options: TransformOptions) -> int:
    """The run of the spec (`source_result`, as written) resharded for the mesh of
    `target_result` (the spec after --set)."""
    out = options.output
    forms = Forms("ckpt reshard", RUN_FORMS)
    with claim(out, {"the run": options.run}, options.force, forms) as held:
        source = read_source(source_result, options.spec, options.run)
        stages = stage_layouts(target_result, options.spec)
        target = {f"stage_{s}.json": stage.text for s, stage in enumerate(stages)} or None
        logical = spec_tensors(target_result)
        name = INIT_FILE if source.files[0].name == INIT_FILE else f"step_{source.step:08d}.ckpt"
        mesh = RankMesh.of(target_result.spec)
        made = _transformed(source, held.work, target)
        ranks = range(mesh.devices) if target else range(mesh.dp)
        for rank in ranks:
            folder = held.staged / f"rank_{rank}"
            folder.mkdir()
            file = made[rank if target else 0]
            want = logical
            if target:
                stage = stages[mesh.stage_of(rank)]
                want = rank_shapes(logical, stage.layouts)
                (folder / STRATEGY_FILE).write_text(stage.text, encoding="utf-8")
            check_tensors(tensor_shapes(file), want, f"rank {rank}")
            shutil.copyfile(file, folder / name)
        if (options.run / SOURCE_FILE).is_file():
            shutil.copyfile(options.run / SOURCE_FILE, held.staged / SOURCE_FILE)
    print(f"wrote {printable(str(out))}: step {source.step} for {len(ranks)} ranks",
          file=sys.stderr)  # fmt: skip
    return EXIT_OK
