"""`msgen estimate`'s text: an aligned table per stage, and the one-line breakdown
the budget check's messages use. The JSON is msgen.estimate.output's models."""

from __future__ import annotations

from fractions import Fraction

from msgen.diagnostics import format_bytes
from msgen.estimate.memory import Estimate, GiB, StageMemory
from msgen.ir.schema import Schedule

# The rows of a stage, as the table, the breakdown and the SVG name them.
ROWS = (
    ("weights_bytes", "weights"),
    ("grads_bytes", "grads"),
    ("accumulation_bytes", "accumulation"),
    ("optimizer_bytes", "optimizer"),
    ("activations_bytes", "activations"),
    ("other_activations_bytes", "other activations"),
    ("logits_bytes", "logits"),
    ("recompute_working_bytes", "recompute working"),
    ("hccl_bytes", "HCCL"),
)


def gib(n: int) -> str:
    return f"{n / GiB:.2f}"


def signed_gib(n: int) -> str:
    return f"{'+' if n >= 0 else '-'}{gib(abs(n))}"


def flight(x: Fraction) -> str:
    return str(int(x)) if x.denominator == 1 else f"{float(x):.2f}"


def activation_note(stage: StageMemory) -> str:
    times = f"x {flight(stage.in_flight_micro_batches)} in flight"
    if len(stage.layer_kinds) == 1:
        (kind,) = stage.layer_kinds
        return (
            f"{format_bytes(kind.activation_bytes_per_layer)} per layer x {kind.copies} layers {times}, "
            f"recompute {kind.layer}: {kind.recompute}"
        )
    kinds = " + ".join(
        f"{k.layer} {format_bytes(k.activation_bytes_per_layer)} x {k.copies} (recompute {k.recompute})"
        for k in stage.layer_kinds
    )
    return f"[{kinds}] {times}" if kinds else "no repeated layers"


def working_note(stage: StageMemory) -> str:
    """What the recompute working row holds: the largest recomputed layer kind's
    re-made tensors, once, net of the network's tensors freed before the layers'
    backward."""
    kinds = [k for k in stage.layer_kinds if k.recompute_working_bytes]
    if not kinds:
        return "none: nothing recomputed"
    kind = max(kinds, key=lambda k: k.recompute_working_bytes)
    note = (
        f"one {kind.layer} layer's tensors re-made in backward, one micro-batch "
        f"({format_bytes(kind.recompute_working_bytes)}, recompute {kind.recompute})"
    )
    if stage.freed_before_layers_bytes:
        note += (
            f", less {format_bytes(stage.freed_before_layers_bytes)} the ops after the "
            "layers freed by then"
        )
    return note


def breakdown(stage: StageMemory) -> str:
    """One line: the non-zero rows in GiB, summed."""
    parts = []
    for key, name in ROWS:
        value = getattr(stage, key)
        if value:
            note = f" ({activation_note(stage)})" if key == "activations_bytes" else ""
            parts.append(f"{name} {gib(value)}{note}")
    return " + ".join(parts) + f" = {gib(stage.total_bytes)} GiB"


# text -------------------------------------------------------------------------


def row_notes(est: Estimate, stage: StageMemory) -> dict[str, str]:
    prec, mesh, zero = est.precision, est.mesh, est.zero
    # the parallel optimizer splits each weight over the devices of its stage holding
    # the same slice (msgen/analysis/optimizer_shard.py): dp of them for a weight split
    # over tp, dp x tp for one whole, fewer for experts
    replicated = mesh["dp"] * mesh["tp"] > 1
    split = "split over the devices holding each slice"

    def over_replicas(level: int) -> str:
        return f", {split} (zero {zero})" if zero >= level and replicated else ""

    gathered = (
        f", a share of each slice + the whole, all-gathered from forward until backward"
        f" (zero {zero})"
        if 0 < zero < 3 and replicated
        else over_replicas(3)
    )
    sliced_buffer = f", {split} (zero 2)" if zero == 2 and replicated else ""

    master = f" + {prec.master_dtype} master copy" if prec.master_dtype else ""
    axes = [a for a, n in mesh.items() if n > 1]
    return {
        "weights_bytes": f"{prec.weight_dtype}{gathered}",
        "grads_bytes": f"{prec.grad_dtype}{over_replicas(1)}",
        "accumulation_bytes": (
            f"the gradients' size{sliced_buffer}, for {est.micro_batches} micro-batches"
            if stage.accumulation_bytes
            else "none: one micro-batch per step"
        ),
        "optimizer_bytes": f"Adam m, v fp32{master}{over_replicas(1)}",
        "activations_bytes": activation_note(stage),
        "other_activations_bytes": "saved by the network's ops outside the repeated layers",
        "logits_bytes": "the loss's working set (fp32 logits)" if stage.logits_bytes else "",
        "recompute_working_bytes": working_note(stage),
        "hccl_bytes": (
            f"2 x 200 MiB for each of {', '.join(axes)}" if axes else "none: one device"
        ),
    }


def verdict(stage: StageMemory) -> str:
    budget = stage.budget_bytes
    if budget is None:
        return "no budget"
    spare = budget - stage.total_bytes
    if spare < 0:
        return f"OVER BUDGET by {gib(-spare)} GiB"
    if stage.tight:
        return f"fits, {gib(spare)} GiB spare, less than the headroom"
    return f"fits, {gib(spare)} GiB spare"


def render_text(est: Estimate, overrides: list[str] = (), timing: list[str] = ()) -> str:
    """The whole report; `timing` (the time section's lines) goes before the verdict."""
    prec = est.precision
    mesh = est.mesh
    device = est.device
    lines = [
        f"{est.model}: {est.params_total:,} parameters ({est.params_total / 1e9:.2f} B) on "
        f"{est.devices} x {device.name if device else '?'}, "
        f"dp {mesh['dp']} x tp {mesh['tp']} x pp {mesh['pp']}"
        + (f" (ep {mesh['ep']} inside dp)" if mesh["ep"] > 1 else "")
    ]
    if est.params_active != est.params_total:
        active = est.params_active
        lines.append(f"  active per token: {active:,} parameters ({active / 1e9:.2f} B)")
    if est.params_mtp:
        mtp = est.params_mtp
        lines.append(f"  multi-token prediction: {mtp:,} parameters ({mtp / 1e9:.2f} B) of them")
    if overrides:
        lines.append("  what-if: " + " ".join(f"--set {o}" for o in overrides))
    master = f" + master {prec.master}" if prec.master else ""
    lines.append(
        f"  bytes per parameter: weights {prec.weight} + grads {prec.grad}{master} + "
        f"Adam {prec.optimizer} = {prec.per_param}; zero {est.zero}"
    )
    schedule = est.schedule + (
        f"(chunks = {est.chunks})" if est.schedule == Schedule.INTERLEAVED else ""
    )
    per_step = f"{est.micro_batches} micro-batch{'es' if est.micro_batches > 1 else ''} per step"
    lines.append(f"  pipeline: {schedule}, {per_step}")
    if est.budget_bytes is not None:
        if est.budget_source == "device" and device is not None:
            source = (
                f"{device.name}: {gib(device.hbm_bytes)} GiB HBM - "
                f"{gib(device.reserve_bytes)} GiB runtime reserve"
            )
        else:
            source = est.budget_source
        lines.append(f"  budget: {gib(est.budget_bytes)} GiB per device ({source})")
    for stage in est.stages:
        lines += [""] + stage_table(est, stage)
    if timing:
        lines += [""] + list(timing)
    lines.append("")
    over = [s.stage for s in est.stages if not s.fits]
    if not over:
        lines.append(f"fits: every stage within {gib(est.budget_bytes)} GiB per device")
    else:
        which = "stage " + ", ".join(map(str, over)) if len(over) < 8 else f"{len(over)} stages"
        lines.append(
            f"over budget: {which} above {gib(est.budget_bytes)} GiB per device "
            "(MSL401 above lists changes that would fit)"
        )
    return "\n".join(lines) + "\n"


def stage_table(est: Estimate, stage: StageMemory) -> list[str]:
    notes = row_notes(est, stage)
    width = max(len(name) for _, name in ROWS)
    values = {key: gib(getattr(stage, key)) for key, _ in ROWS}
    budget = est.budget_bytes
    values["total"] = gib(stage.total_bytes)
    values["headroom"] = gib(stage.headroom_bytes)
    pad = max(len(v) for v in values.values())

    def row(name: str, value: str, note: str) -> str:
        text = f"  {name:<{width}}  {value:>{pad}} GiB"
        return f"{text}   {note}" if note else text

    out = [f"stage {stage.stage}: {stage.layers} layers, {stage.params:,} parameters per device"]
    out += [row(name, values[key], notes[key]) for key, name in ROWS]
    out.append("  " + "-" * (width + pad + 6))
    of = f"of the {gib(budget)} GiB budget" if budget is not None else ""
    out.append(row("total", values["total"], of))
    out.append(row("headroom", values["headroom"], "10% for fragmentation, not added"))
    out.append(f"  {'verdict':<{width}}  {verdict(stage)}")
    return out
