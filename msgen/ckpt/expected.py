"""What a checkpoint of a spec holds: each parameter's logical shape, the optimizer
moments beside them, the strategy files `msgen compile` writes for its mesh, and the
check that a checkpoint is one of this spec's (every name known, every shape right)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from msgen.base.status import UsageError
from msgen.ckpt.slices import LayoutError, slice_shape
from msgen.diagnostics import printable
from msgen.ir.mesh import RankMesh

MOMENTS = ("adam_m.", "adam_v.")  # train.py's AdamW clones each parameter twice
# what train.py saves beside parameters and moments (the step counters, the loss scale,
# the moe layers' auxiliary-loss total: model.py's AuxLosses, and the multi-token
# prediction modules' loss total: its MultiTokenPrediction; both zeroed before each step)
STATE = ("global_step", "step", "loss_scale.value", "loss_scale.counter", "add_aux.total",
         "mtp.total")  # fmt: skip


def spec_params(result) -> dict[str, tuple[int, ...]]:
    """Every parameter path of the analysed spec with its logical shape."""
    from msgen.analysis.plan import build_plan

    plan = build_plan(result.spec, result.facts)
    out = {f"{op}.{p.name}": tuple(p.shape) for op, p in plan.network_params()}
    for rep in plan.repeats:
        for copy in range(rep.count):
            for op, p in plan.layer_params(rep.layer):
                out[f"{rep.layer}.{copy}.{op}.{p.name}"] = tuple(p.shape)
    return out


def spec_buffers(result) -> dict[str, tuple[int, ...]]:
    """The ops' buffers (moe's correction bias and load count) by path, with their shapes."""
    from msgen.analysis.plan import build_plan

    return build_plan(result.spec, result.facts).buffers()


def _buffer(name: str) -> bool:
    """A buffer a checkpoint may leave out: it starts at its initial value (the moe
    op's correction bias at zero, its load count zeroed before each step)."""
    from msgen.ops.moe_routing import BUFFERS

    return name.rsplit(".", 1)[-1] in BUFFERS


def with_moments(params: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    return {**params, **{m + n: s for m in MOMENTS for n, s in params.items()}}


def spec_tensors(result) -> dict[str, tuple[int, ...]]:
    """What a training checkpoint of the spec holds: the parameters and their moments,
    and the buffers (moe's correction bias), which have none."""
    return with_moments(spec_params(result)) | spec_buffers(result)


def expected_strategies(result, spec_path: Path) -> dict[str, str]:
    """`stage_<s>.json` -> the strategy file `msgen compile` writes for that pipeline
    stage; empty for a data-parallel mesh (no rank writes one)."""
    from msgen.analysis.plan import build_plan
    from msgen.emit import emit

    if not result.spec.semi_auto:
        return {}
    files = emit(build_plan(result.spec, result.facts), spec_path.as_posix())
    return {
        path.removeprefix("strategy/"): text
        for path, text in files.items()
        if path.startswith("strategy/")
    }


@dataclass(frozen=True)
class Stage:
    text: str  # the strategy file compile writes for it
    layouts: dict  # tensor name -> its layout there
    ranks: range  # the stage's ranks, by local rank (the mesh's owner's)


def stage_layouts(result, spec_path: Path) -> list[Stage]:
    """The spec's pipeline stages in order, as its strategy files lay them out; empty
    for a data-parallel mesh (every rank whole)."""
    files = expected_strategies(result, spec_path)
    mesh = RankMesh.of(result.spec)
    stages = []
    for s in range(len(files)):
        text = files[f"stage_{s}.json"]
        layouts = json.loads(text)["parallel_layout_item"]
        stages.append(Stage(text, layouts, mesh.stage_ranks(s)))
    return stages


def rank_shapes(logical: dict, layouts: dict) -> dict[str, tuple[int, ...]]:
    """The slice shape of each tensor a rank of a stage with these layouts holds."""
    out = {}
    for name, layout in layouts.items():
        if name in logical:
            try:
                out[name] = slice_shape(logical[name], layout)
            except LayoutError as exc:
                raise UsageError(
                    f"the mesh cannot hold the spec's tensor {printable(name)}: {exc}"
                ) from None
    # a buffer (the correction bias) is whole on every rank of its op's stage
    ops = {name.rsplit(".", 1)[0] for name in out}
    out |= {n: logical[n] for n in logical if _buffer(n) and n.rsplit(".", 1)[0] in ops}
    return out


def check_tensors(got: dict[str, tuple[int, ...]], want: dict[str, tuple[int, ...]], where=""):
    """`got` is a checkpoint of the spec whose tensors are `want`: every name known and
    of its shape, every parameter there, the moments all there or none (weights only).
    A usage error names the first difference."""
    at = f"{where}: " if where else ""
    for name, shape in got.items():
        if name in STATE:
            continue
        if name not in want:
            raise UsageError(f"{at}{printable(name)} is not a parameter of the spec")
        if tuple(shape) != tuple(want[name]):
            raise UsageError(f"{at}{name} is {list(shape)} here, {list(want[name])} in the spec")
    moments = any(n.startswith(MOMENTS) for n in got)
    missing = sorted(
        n
        for n in want
        if n not in got and (moments or not n.startswith(MOMENTS)) and not _buffer(n)
    )
    if missing:
        raise UsageError(f"{at}the spec's {missing[0]} has no tensor ({len(missing)} missing)")
