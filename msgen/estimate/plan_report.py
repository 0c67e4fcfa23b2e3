"""`msgen plan`: render a layout search (msgen.estimate.planner) as text or JSON.

JSON: {"objective", "searched" (layouts that pass every check but the budget),
"fitting", "spec": {step_s, peak_bytes, mfu, fits, set}, "plans": [{rank, set
(every searched key as `--set` takes it, in any order, after the `--set` values
the search started from that it does not search), step_s, peak_bytes,
headroom_bytes, headroom_kept (false: some stage fits without the 10%
fragmentation headroom, which `check` warns as MSL402; such plans rank after
those that keep it), budget_bytes, mfu, hfu, tokens_per_s_per_device, memory: the
peak stage's `estimate` rows, time: `estimate`'s time object}], and when
nothing fits "smallest" (the lowest peak any layout reaches)}.
"""

from __future__ import annotations

from msgen.estimate.output import stage_report, time_report
from msgen.estimate.planner import Ranked, Search
from msgen.estimate.report import gib
from msgen.estimate.time_report import moe_lines, moe_validation, seconds
from msgen.estimate.whatif import set_args
from msgen.ir.models import Spec


def moe_of(r: Ranked, spec: Spec):
    """What the layout's MoE step time was checked against (None without moe ops)."""
    return moe_validation(spec, r.layout.ep or 1, r.layout.tp)


def ranked_json(r: Ranked, flags: tuple[str, ...], spec: Spec) -> dict:
    t = r.time
    peak = r.estimate.peak
    return {
        "set": list(flags),
        "step_s": t.step_s,
        "peak_bytes": r.peak_bytes,
        "headroom_bytes": peak.headroom_bytes,
        "headroom_kept": r.headroom_kept,
        "budget_bytes": r.estimate.budget_bytes,
        "fits": r.estimate.fits,
        "mfu": t.mfu,
        "hfu": t.hfu,
        "tokens_per_s_per_device": t.tokens_per_s_per_device,
        "memory": stage_report(peak).model_dump(mode="json"),
        "time": time_report(t, moe_of(r, spec)).model_dump(mode="json"),
    }


def search_json(found: Search, objective: str, spec: Spec) -> dict:
    out: dict = {"objective": objective, "searched": found.searched, "fitting": found.fitting}
    if found.spec is not None:
        mine = ranked_json(found.spec, found.flags(found.spec), spec)
        out["spec"] = {k: mine[k] for k in ("step_s", "peak_bytes", "mfu", "fits", "set")}
    out["plans"] = [
        {"rank": i + 1, **ranked_json(r, found.flags(r), spec)} for i, r in enumerate(found.plans)
    ]
    if not found.plans and found.smallest is not None:
        out["smallest"] = ranked_json(found.smallest, found.flags(found.smallest), spec)
    return out


TIGHT = " [TIGHT: less spare than the headroom; check warns MSL402]"
UNVALIDATED = " [MoE time NOT VALIDATED]"


def describe(r: Ranked) -> str:
    lay = r.layout
    rc = ", ".join(f"{layer} {mode}" for layer, mode in lay.recompute)
    ep = f" (ep {lay.ep})" if lay.ep is not None else ""
    return (
        f"dp {lay.dp} x tp {lay.tp} x pp {lay.pp}{ep}, micro-batch {lay.micro_batch} x "
        f"{lay.micro_batches}, zero {lay.zero}, recompute {rc}, {lay.schedule}"
    )


def line(r: Ranked, spec: Spec) -> str:
    budget = r.estimate.budget_bytes
    spare = f", {gib(budget - r.peak_bytes)} GiB spare" if budget is not None else ""
    flag = "" if r.headroom_kept or not r.estimate.fits else TIGHT
    moe = moe_of(r, spec)
    flag += UNVALIDATED if moe and not moe.validated else ""
    return (
        f"step {seconds(r.time.step_s)}, MFU {r.time.mfu:.1%}, peak {gib(r.peak_bytes)} GiB"
        f"{spare} (headroom {gib(r.estimate.peak.headroom_bytes)} GiB){flag}"
    )


def moe_note(found: Search, spec: Spec) -> list[str]:
    """With moe ops, once: what the MoE step times were checked against, and what the
    plans marked NOT VALIDATED have that no checked run had."""
    ranked = [r for r in (found.spec, *found.plans) if r is not None]
    judged = [v for v in (moe_of(r, spec) for r in ranked) if v is not None]
    if not judged:
        return []
    unchecked = tuple(sorted({u for v in judged for u in v.unchecked}))
    return ["", *moe_lines(unchecked, " for the plans marked so")]


def render(found: Search, spec: Spec, objective: str) -> str:
    by = "step time" if objective == "time" else "peak memory"
    lines = [
        f"{spec.model.name}: {found.searched:,} layouts pass every check but the budget; "
        f"{found.fitting:,} fit; ranked by {by}",
        *moe_note(found, spec),
    ]
    if found.spec is not None:
        verdict = "fits" if found.spec_fits else "does NOT fit"
        lines += [
            "",
            f"as written ({verdict}): {line(found.spec, spec)}",
            f"  {describe(found.spec)}",
        ]
    for i, r in enumerate(found.plans):
        lines += [
            "",
            f"{i + 1}. {line(r, spec)}",
            f"   {describe(r)}",
            f"   {set_args(found.flags(r))}",
        ]
    if not found.plans:
        lines += ["", "nothing fits the budget on these devices."]
        if found.smallest is not None:
            s = found.smallest
            budget = s.estimate.budget_bytes or 1
            lines.append(
                f"the smallest peak any layout reaches is {gib(s.peak_bytes)} GiB "
                f"({s.peak_bytes / budget:.2f} x the budget): {describe(s)}"
            )
        lines.append(
            "what would fit: more devices (more nodes), a smaller global_batch with a "
            "smaller micro_batch, or a shorter seq"
        )
    return "\n".join(lines) + "\n"
