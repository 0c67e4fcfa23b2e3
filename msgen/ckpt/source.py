"""What merge, reshard and to-hf read from a run folder: the newest step every rank
folder holds, the strategy files that describe its slices, and the check that each
rank's file of that step is the slices its strategy file describes.

A rank folder's mesh is its `strategy.json` (train.py writes it when its step compiles;
reshard and from-hf write it beside the slices), or, without one, the spec's mesh. A
step file whose tensors are not the shapes that layout gives the rank is a step saved
under another mesh (or of another spec): refused, naming the file, never merged with
the others. Shapes are read from the files' headers (msgen.ckpt.ckptfile), not their
data.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from msgen.base.readers import BadInput, Dict, Int, List, Obj, load_json
from msgen.base.status import UsageError
from msgen.ckpt.ckptfile import CkptFileError, tensor_shapes
from msgen.ckpt.expected import (
    check_tensors,
    expected_strategies,
    rank_shapes,
    spec_tensors,
    stage_layouts,
)
from msgen.ckpt.runs import INIT_FILE, common_step, rank_folders, run_strategies
from msgen.diagnostics import printable
from msgen.ir.mesh import RankMesh

STRATEGY_LIMIT = 64 << 20  # a strategy file is a few hundred bytes per tensor


# tensor_map: per tensor dim, the device dim splitting it (counted from the right) or -1
LAYOUT = Obj(
    required={
        "dev_matrix": List(Int(1, 1 << 20), max_len=64),
        "tensor_map": List(Int(-1, 63), max_len=64),
    },
    optional={"opt_weight_shard_size": Int(0, 1 << 20), "opt_weight_shard_step": Int(0, 1 << 20)},
)
# MindSpore's merge of pipeline strategies reads each file's first strategy item's
# stage (parallel/_parallel_serialization.py, _merge_json_strategy).
STRATEGY = Obj(
    required={
        "parallel_layout_item": Dict(LAYOUT),
        "parallel_strategy_item": Dict(Obj(required={"stage": Int(0, 1 << 20)})),
    }
)


@dataclass(frozen=True)
class Source:
    step: int
    files: list[Path]  # one per rank (one whole file when `strategy` is None)
    strategy: dict[str, str | Path] | None  # flat name -> strategy text or file


def read_layouts(path: Path) -> dict:
    """A rank's strategy file: tensor name -> its layout, each checked."""
    doc = load_json(path, STRATEGY_LIMIT, STRATEGY)
    if not doc["parallel_strategy_item"]:
        raise BadInput(f"{printable(str(path))}: parallel_strategy_item: empty")
    for name, layout in doc["parallel_layout_item"].items():
        dims = len(layout["dev_matrix"])
        if any(m >= dims for m in layout["tensor_map"]):
            raise BadInput(
                f"{printable(str(path))}: parallel_layout_item.{printable(name)}.tensor_map: "
                f"names a device dim past the {dims} of dev_matrix"
            )
    return doc["parallel_layout_item"]


def held(file: Path, want: dict[str, tuple[int, ...]], mesh: str) -> None:
    """`file` holds the tensors `want` gives it (per `mesh`, for the message)."""
    try:
        got = tensor_shapes(file)
    except CkptFileError as exc:
        raise UsageError(f"{printable(str(file))} is not a checkpoint ({exc})") from None
    except OSError as exc:
        raise UsageError(f"cannot read {printable(str(file))}: {exc.strerror}") from None
    try:
        check_tensors(got, want)
    except UsageError as exc:
        raise UsageError(
            f"{printable(str(file))} is not the slices {mesh} gives it ({exc}): "
            "a step saved under another mesh or spec; move it away"
        ) from None


def read_source(result, spec: Path, run: Path) -> Source:
    """The run's newest common step, each rank's file of it checked against its mesh,
    and the strategy files that describe its slices."""
    logical = spec_tensors(result)
    if (run / INIT_FILE).is_file() and not any(run.glob("rank_*")):
        held(run / INIT_FILE, logical, "the spec")
        return Source(0, [run / INIT_FILE], None)  # from-hf's whole checkpoint
    folders = rank_folders(run)
    step, files = common_step(folders)
    own = run_strategies(folders)
    if own is not None:
        for file, strategy in zip(files, own):
            named = f"{strategy.parent.name}/{strategy.name}"
            try:
                want = rank_shapes(logical, read_layouts(strategy))
            except BadInput:
                raise
            except UsageError as exc:  # a layout no MindSpore run writes: the file is damaged
                raise BadInput(f"{printable(named)}: {exc}") from None
            held(file, want, named)
        return Source(step, files, {f"{p.parent.name}.json": p for p in own})
    expected = expected_strategies(result, spec)
    mesh = RankMesh.of(result.spec)
    world = mesh.devices
    if expected and len(folders) != world:
        raise UsageError(
            f"{printable(str(run))} has {len(folders)} rank folders and no strategy files; "
            f"the spec's mesh has {world} ranks"
        )
    stages = stage_layouts(result, spec)
    for rank, file in enumerate(files):
        if stages:
            layouts = stages[mesh.stage_of(rank)].layouts
            held(file, rank_shapes(logical, layouts), "the spec's mesh")
        else:  # a data-parallel run: every rank holds the whole model
            held(file, logical, "the spec's data-parallel mesh")
    return Source(step, files if expected else files[:1], expected or None)
