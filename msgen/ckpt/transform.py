"""MindSpore's own checkpoint tools, driven on a staged run: the strategy files merged
over the pipeline stages (merge_pipeline_strategys), then the slices transformed
(transform_checkpoints, the ckpt path: on safetensors input, safetensors 0.8.0 writes
wrong slices when the target splits a dim other than the first, upstream issue 825).
Both in mindspore/parallel/checkpoint_transform.py. MindSpore is imported here only,
inside the functions.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from msgen.base.status import UsageError

PREFIX = "transformed"  # transform_checkpoints writes rank_<r>/<PREFIX><r>.ckpt


def _one_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def merged_strategy(files: dict[str, str | Path], folder: Path) -> Path:
    """The stages' strategy files (name -> text, or a file to copy) put in one flat
    folder and merged into `folder/merged.json`."""
    import mindspore as ms

    flat = folder / "strategies"
    flat.mkdir(parents=True)
    for name, source in files.items():
        if isinstance(source, Path):
            shutil.copyfile(source, flat / name)
        else:
            (flat / name).write_text(source, encoding="utf-8")
    merged = folder / "merged.json"
    try:
        ms.parallel.merge_pipeline_strategys(str(flat), str(merged))
    except (ValueError, KeyError, TypeError, OSError) as exc:
        raise UsageError(f"the strategy files do not merge: {_one_line(exc)}") from exc
    return merged


def transform(staged: Path, out: Path, src: Path | None, dst: Path | None) -> dict[int, Path]:
    """rank -> its transformed checkpoint, for the mesh of `dst` (None: one whole
    checkpoint), from the slices staged one per rank folder under the mesh of `src`
    (None: whole)."""
    import mindspore as ms

    try:
        ms.parallel.transform_checkpoints(
            str(staged), str(out), PREFIX, None if src is None else str(src),
            None if dst is None else str(dst),
        )  # fmt: skip
    except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as exc:
        raise UsageError(f"MindSpore cannot transform the checkpoints: {_one_line(exc)}") from exc
    found = {}
    for folder in out.glob("rank_*"):
        (file,) = folder.glob("*.ckpt")
        found[int(folder.name.removeprefix("rank_"))] = file
    return dict(sorted(found.items()))


def load(path: Path) -> dict:
    """name -> Parameter of a checkpoint MindSpore wrote."""
    import mindspore as ms

    try:
        return ms.load_checkpoint(str(path))
    except (ValueError, RuntimeError, OSError) as exc:
        raise UsageError(f"cannot read {path}: {_one_line(exc)}") from exc
