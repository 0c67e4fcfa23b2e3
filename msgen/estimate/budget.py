"""Budget: every pipeline stage's peak memory per device fits the budget.

A stage over budget is MSL401, with its breakdown and up to three changes that
would make every stage fit, each with its effect from estimating the changed
spec (msgen.estimate.whatif). A stage that fits without the 10% fragmentation
headroom is warning MSL402. A budget above what the device can give is MSL403.
"""

from __future__ import annotations

from msgen.analysis.facts import Facts
from msgen.analysis.plan import Plan
from msgen.diagnostics import Diagnostic, Span, error, warning
from msgen.estimate.memory import Estimate, StageMemory, budget_of, estimate
from msgen.estimate.report import breakdown, gib, signed_gib
from msgen.ir.models import Spec


def budget_span(spec: Spec) -> Span:
    """The budget line, or the device line when the budget comes from the device."""
    if "device_memory" in spec.budget.spans:
        return spec.budget.spans["device_memory"]
    return spec.cluster.spans.get("device", spec.cluster.span)


def run(spec: Spec, facts: Facts) -> list[Diagnostic]:
    budget, _ = budget_of(spec)
    if budget is None:
        return []
    beyond = beyond_device(spec, budget)
    if beyond is not None:
        return [beyond]
    est = estimate(Plan(spec, facts))
    span = budget_span(spec)
    over = [s for s in est.stages if not s.fits]
    diags: list[Diagnostic] = []
    if over:
        from msgen.estimate.whatif import set_args, suggestions  # only needed over budget

        found, fit = suggestions(spec, facts)
        for stage in over:
            lines = [f"per device: {breakdown(stage)}"]
            if found:
                lines.append(
                    "changes that fit every stage:"
                    if fit
                    else "no change msgen tried fits, alone or in pairs; those that save most:"
                )
            for s in found:
                effect = change_effect(stage, est, s.estimate)
                lines.append(f"  {s.label}: {effect} ({set_args(s.overrides)})")
            diags.append(
                error(
                    "MSL401",
                    f"stage {stage.stage} needs {gib(stage.total_bytes)} GiB per device, "
                    f"{gib(stage.total_bytes - budget)} GiB over the {gib(budget)} GiB budget",
                    span,
                    "\n".join(lines),
                )
            )
    for stage in est.stages:
        if stage.tight:
            diags.append(
                warning(
                    "MSL402",
                    f"stage {stage.stage} needs {gib(stage.total_bytes)} GiB of the "
                    f"{gib(budget)} GiB budget: {gib(budget - stage.total_bytes)} GiB to spare, "
                    f"less than the {gib(stage.headroom_bytes)} GiB (10%) fragmentation headroom",
                    span,
                    "MindSpore's peak with fragments is usually about 10% above the used peak; "
                    "`msgen estimate` shows where the memory goes",
                )
            )
    return diags


def beyond_device(spec: Spec, budget: int) -> Diagnostic | None:
    """MSL403 when the written budget is more than the device can give (its memory
    less the runtime's reserve): a fit against it would promise memory that is not
    there."""
    from msgen.estimate.report import gib
    from msgen.ir.devices import DEVICES

    device = DEVICES.get(spec.cluster.device)
    if device is None or budget <= device.usable_bytes:
        return None
    return error(
        "MSL403",
        f"the budget of {gib(budget)} GiB per device is more than {device.name} can give: "
        f"{gib(device.usable_bytes)} GiB ({gib(device.hbm_bytes)} GiB HBM - "
        f"{gib(device.reserve_bytes)} GiB runtime reserve)",
        budget_span(spec),
        f"lower device_memory to at most {gib(device.usable_bytes)} GiB, or remove it "
        "to budget what the device can give",
    )


def change_effect(stage: StageMemory, before: Estimate, after: Estimate) -> str:
    """What a change does to an over-budget stage: that stage's new total while
    the pipeline keeps its depth, else the fullest stage of the new pipeline."""
    if len(after.stages) == len(before.stages):
        new = after.stages[stage.stage].total_bytes
        return f"stage {stage.stage} {signed_gib(new - stage.total_bytes)} GiB, to {gib(new)} GiB"
    peak = after.peak
    return (
        f"{len(after.stages)} stages, the fullest (stage {peak.stage}) at "
        f"{gib(peak.total_bytes)} GiB, {signed_gib(peak.total_bytes - stage.total_bytes)} GiB"
    )
