"""Pipeline: the repeated layers split over pp stages, none empty; enough
micro-batches to fill the pipeline; an interleaved schedule's chunks fit the layers.

The layers are the network's repeated layers: the sum of its `repeat` counts
(not the model's `layers` dim, which a spec may use for anything).
"""

from __future__ import annotations

from msgen.analysis.facts import Facts
from msgen.analysis.placement import balanced_split
from msgen.diagnostics import Diagnostic, error
from msgen.ir.models import Spec
from msgen.ir.schema import Schedule


def fmt_list(items) -> str:
    return "[" + ", ".join(str(i) for i in items) + "]"


def example(layers: int, pp: int) -> str:
    """`, e.g. split = [..]` (balanced) when such a split exists and is short to show."""
    if not 0 < pp <= min(layers, 32):
        return ""
    return f", e.g. split = {fmt_list(balanced_split(layers, pp))}"


def check_split(spec: Spec, layers: int) -> list[Diagnostic]:
    pp, pipe = spec.mesh.pp, spec.pipeline
    split = pipe.split
    pp_span = spec.mesh.spans.get("pp", spec.mesh.span)
    if split is None:
        if pp <= layers:
            return []
        what = f"only {layers}" if layers else "no"
        return [
            error(
                "MSL312",
                f"pp = {pp} stages, but the network repeats {what} "
                f"{'layer' if layers == 1 else 'layers'}: some stages would be empty",
                pp_span,
                f"use at most pp = {max(1, layers)}, and put the rest of the devices in dp",
            )
        ]
    span = pipe.spans.get("split", pipe.span)
    if len(split) != pp:
        stages = "stage" if len(split) == 1 else "stages"
        return [
            error(
                "MSL314",
                f"split lists {len(split)} {stages}, but pp = {pp}",
                span,
                "give one layer count per pipeline stage" + example(layers, pp),
            )
        ]
    empty = [i for i, n in enumerate(split) if n <= 0]
    if empty:
        stage = empty[0]
        return [
            error(
                "MSL312",
                f"stage {stage} gets {split[stage]} layers in split = {fmt_list(split)}",
                span,
                "every stage needs at least one layer" + example(layers, pp),
            )
        ]
    if sum(split) != layers:
        return [
            error(
                "MSL311",
                f"split = {fmt_list(split)} adds up to {sum(split)} layers, but the network "
                f"repeats {layers}",
                span,
                f"the counts must sum to {layers}" + example(layers, pp),
            )
        ]
    return []


def check_schedule(spec: Spec, layers: int) -> list[Diagnostic]:
    pipe, pp = spec.pipeline, spec.mesh.pp
    if pipe.schedule != Schedule.INTERLEAVED:
        return []
    chunks = pipe.chunks
    if pipe.split is not None:
        # Each stage's `split` count is divided over its chunks (msgen/analysis/placement.py), so a
        # stage with fewer layers than chunks would leave a virtual stage empty.
        short = [i for i, n in enumerate(pipe.split) if 0 < n < chunks]
        if pp == 1 or chunks == 1 or not short or len(pipe.split) != pp:
            return []
        stage = short[0]
        return [
            error(
                "MSL315",
                f"interleaved(chunks = {chunks}) splits each stage's layers into {chunks} "
                f"chunks, but stage {stage} gets {pipe.split[stage]} in "
                f"split = {fmt_list(pipe.split)}",
                pipe.spans.get("split", pipe.span),
                f"give every stage at least {chunks} layers, or use fewer chunks",
            )
        ]
    if layers % (pp * chunks) == 0 and layers >= pp * chunks:
        return []
    good = [c for c in range(1, min(layers, 64) + 1) if layers % (pp * c) == 0]
    hint = (
        f"use chunks = {' or '.join(str(c) for c in good[:3])}, or give `split`"
        if good
        else "use 1f1b, or give `split`"
    )
    return [
        error(
            "MSL315",
            f"interleaved(chunks = {chunks}) over pp = {pp} stages needs the layers divisible "
            f"by pp * chunks = {pp * chunks}; the network repeats {layers}",
            pipe.spans.get("schedule", pipe.span),
            hint,
        )
    ]


def check_micro_batches(spec: Spec) -> list[Diagnostic]:
    pp, pipe = spec.mesh.pp, spec.pipeline
    mb = spec.micro_batches
    if mb >= pp:
        return []
    if pipe.micro_batches is not None:
        span = pipe.spans.get("micro_batches", pipe.span)
        what = f"micro_batches = {mb}"
        hint = f"use micro_batches >= {pp} (and global_batch to match)"
    else:
        train = spec.train
        span = spec.mesh.spans.get("pp", spec.mesh.span)
        what = (
            f"micro_batches = global_batch / (micro_batch * dp) = {train.global_batch} / "
            f"({train.micro_batch} * {spec.mesh.dp}) = {mb}"
        )
        hint = (
            f"raise global_batch to at least {pp * train.micro_batch * spec.mesh.dp}, "
            "or use fewer stages"
        )
    return [
        error(
            "MSL313",
            f"{what} is fewer than pp = {pp} stages: the pipeline never fills",
            span,
            hint,
        )
    ]


def run(spec: Spec, facts: Facts) -> list[Diagnostic]:
    layers = spec.network.total_layers
    return check_split(spec, layers) + check_schedule(spec, layers) + check_micro_batches(spec)
