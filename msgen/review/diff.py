"""Two sides to one DiffReport: every section that both sides allow, and the verdict."""

from __future__ import annotations

from msgen.estimate.report import gib
from msgen.estimate.time_report import seconds
from msgen.review.compare import compare_files, compare_memory, compare_time
from msgen.review.model import DiffReport
from msgen.review.numbers import count, delta
from msgen.review.settings import compare_settings
from msgen.review.sides import Side
from msgen.review.strategies import compare_ops, compare_params, op_facts, param_facts

FITS = {
    (True, True): "fits before and after",
    (True, False): "no longer fits",
    (False, True): "now fits",
    (False, False): "fits neither before nor after",
}


def _errors(side: Side) -> str:
    codes = sorted({d.code for d in side.result.diagnostics if d.is_error})
    n = sum(d.is_error for d in side.result.diagnostics)
    return f"{side.label} has {count(n, 'error')} ({', '.join(codes)})"


def _peak(est: dict) -> tuple[int, int]:
    """(bytes, stage) of the stage with the largest total, the first of equals."""
    return max((s["total_bytes"], -s["stage"]) for s in est["stages"])


def memory_phrase(old: dict, new: dict) -> str:
    (a, _), (b, stage) = _peak(old), _peak(new)
    budget = new["budget_bytes"]
    of = f" of {gib(budget)} GiB" if budget else " GiB"
    if a == b:
        return f"peak unchanged ({gib(b)}{of})"
    change = delta("total_bytes", b - a)
    return f"peak {change} on stage {-stage} ({gib(a)} → {gib(b)}{of})"


def time_phrase(old: dict | None, new: dict | None) -> str | None:
    if old is None or new is None:
        return None
    a, b = old["step_s"], new["step_s"]
    if a == b:
        return f"step unchanged ({seconds(b)})"
    pct = (b / a - 1) * 100
    digits = 0 if abs(pct) >= 1 else 1  # a change under 1% is not "+0%"
    return f"step {pct:+.{digits}f}% ({seconds(a)} → {seconds(b)})"


def verdict(old: Side, new: Side, changed: bool) -> str:
    if new.status == "errors":
        also = f"; {_errors(old)}" if old.status == "errors" else ""
        return f"{_errors(new)}: it does not compile{also}"
    if not changed:
        return "no change: the same settings, memory, step time, strategies and generated files"
    if old.estimate is None:
        fits = "fits" if new.estimate["fits"] else "does not fit"
        return f"{_errors(old)}; {new.label} {fits}"
    parts = [
        FITS[(old.estimate["fits"], new.estimate["fits"])],
        memory_phrase(old.estimate, new.estimate),
        time_phrase(old.estimate["time"], new.estimate["time"]),
    ]
    return "; ".join(p for p in parts if p)


def diff_sides(old: Side, new: Side, set_keys: set[str] = frozenset()) -> DiffReport:
    a, b = old.result.spec, new.result.spec
    settings = compare_settings(a, b, set_keys) if a is not None and b is not None else None
    memory = time = ops = params = files = None
    if old.estimate is not None and new.estimate is not None:
        memory = compare_memory(old.estimate, new.estimate)
        time = compare_time(old.estimate["time"], new.estimate["time"])
        old_plan, new_plan = old.plan, new.plan
        ops = compare_ops(op_facts(a, old.context, old_plan), op_facts(b, new.context, new_plan))
        params = compare_params(param_facts(old_plan), param_facts(new_plan))
        files = compare_files(old.files, new.files)
    changed = old.status != new.status or any(
        (
            settings,
            memory and (memory.stages or memory.params_total),
            time and (time.items or time.stages),
            ops,
            params,
            files,
        )
    )
    notes = []
    if new.status == "over budget":
        notes.append(
            f"{new.label} is over its budget: compile refuses to write it; the files are "
            "those it would write"
        )
    if new.result.rederived:
        notes.append(f"--set keeps {new.result.kept}: {', '.join(new.result.rederived)}")
    return DiffReport(
        old=old.report(),
        new=new.report(),
        verdict=verdict(old, new, bool(changed)),
        changed=bool(changed),
        settings=settings,
        memory=memory,
        time=time,
        ops=ops,
        params=params,
        files=files,
        notes=notes,
    )
