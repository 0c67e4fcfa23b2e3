"""`msgen report`'s terminal summary, from the report as data."""

from __future__ import annotations

from msgen.diagnostics import printable
from msgen.estimate.report import gib
from msgen.estimate.time_report import seconds
from msgen.runs.logs import spans
from msgen.runs.output import RunReport, VersusReport
from msgen.syntax.overrides import flags


def maybe(x, fmt: str, unit: str = "") -> str:
    return "-" if x is None else f"{x:{fmt}}{unit}"


def percent(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.3g}%"


def ratio_line(name: str, v: VersusReport | None, show) -> str | None:
    if v is None:
        return None
    measured = "-" if v.measured is None else show(v.measured)
    ratio = "" if v.ratio is None else f"  ({v.ratio:.2f}x)"
    return f"  {name:<24}{show(v.predicted):>16}{measured:>16}{ratio}"


def render(report: RunReport) -> str:
    """The summary; every text from outside msgen (the folder's name, run.json's values,
    file names) quoted printably: no terminal escape or line break of theirs gets out."""
    s = report.summary
    lines = [f"run {printable(report.run)}: {report.world} rank{'s' if report.world > 1 else ''}, "
             f"summary from rank {s.rank}"]  # fmt: skip
    lines += [f"  note: {printable(n)}" for n in report.notes]
    p = report.provenance
    if p:
        versions = ", ".join(f"{k} {v}" for k, v in sorted((p.get("versions") or {}).items()) if v)
        spec = (p.get("spec") or {}).get("path") or "?"
        where = f"from {spec} on {p.get('host', '?')}, started {p.get('started', '?')}"
        lines.append(f"  {printable(where)}")
        if versions:
            lines.append(f"  {printable(versions)}")
    tokens = "" if s.tokens is None else f", {s.tokens:,} tokens"
    trend = maybe(s.loss_trend_per_100_steps, "+.3g", " per 100 steps")
    valid = (
        "" if s.valid_loss is None else f"; validation {s.valid_loss:.4f} at step {s.valid_step}"
    )
    spread = ""
    if s.step_time_s is not None:
        spread = f" (p10-p90 {seconds(s.step_time_p10_s)} - {seconds(s.step_time_p90_s)})"
    lines += [
        f"  steps {s.steps}{tokens}, {s.skipped} skipped",
        f"  loss {maybe(s.loss, '.4f' if s.loss is None or abs(s.loss) < 1e9 else '.4g')} "
        f"(trend {trend}){valid}",
        "  step time "
        + ("-" if s.step_time_s is None else seconds(s.step_time_s))
        + f"{spread} from step {s.timed_from}",
        f"  {maybe(s.tokens_per_s_per_device, ',.0f')} tokens/s per device, "
        f"MFU {percent(s.mfu)}, peak memory "
        + (
            "- (not measured)" if s.peak_memory_bytes is None else f"{gib(s.peak_memory_bytes)} GiB"
        ),
    ]
    c = report.predicted
    if c is not None:
        given = f" {flags(tuple(c.set))}" if c.set else ""
        lines.append(
            f"predicted by {printable(c.spec)}{printable(given)} on {c.devices} x {c.device},"
            " against measured:"
        )
        lines += [f"  note: {printable(n)}" for n in c.notes]
        lines.append(f"  {'':<24}{'predicted':>16}{'measured':>16}")
        rows = [
            ratio_line("step time", c.step_s, seconds),
            ratio_line("tokens/s per device", c.tokens_per_s_per_device, lambda x: f"{x:,.0f}"),
            ratio_line("MFU", c.mfu, percent),
        ]
        rows += [
            ratio_line(f"peak memory, stage {v.stage}", v, lambda x: f"{gib(int(x))} GiB")
            for v in c.peak_bytes
        ]
        lines += [r for r in rows if r is not None]
    if report.alarms:
        lines.append(f"{report.alarm_count:,} alarm{'s' if report.alarm_count > 1 else ''}:")
        for a in report.alarms:
            who = f"rank {a.rank}" if len(a.ranks) == 1 else f"ranks {spans(a.ranks)}"
            lines.append(f"  step {a.step}, {who}: {a.kind}: {printable(a.message)}")
        lines += [f"  {x.line()}" for x in report.alarms_left_off]
    else:
        lines.append("no alarms")
    return "\n".join(lines) + "\n"
