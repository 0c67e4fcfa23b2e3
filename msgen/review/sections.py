"""The diff as sections of tables, one per area that changed: what the text and the
Markdown renderings both print (msgen.review.render)."""

from __future__ import annotations

from dataclasses import dataclass, field

from msgen.estimate.report import ROWS
from msgen.estimate.time_report import TERMS
from msgen.review.model import DiffReport, Item, SideReport
from msgen.review.numbers import NONE, count, delta, value

NAMES = (
    dict(ROWS)
    | dict(TERMS)
    | {
        "params": "parameters",
        "total_bytes": "total",
        "total_s": "total",
        "params_total": "parameters (model)",
        "budget_bytes": "budget",
        "step_s": "step",
        "tokens_per_s_per_device": "tokens/s per device",
        "mfu": "MFU",
        "hfu": "HFU",
    }
)


@dataclass(frozen=True)
class Table:
    heads: tuple[str, ...]
    kinds: str
    """Per column: `t` text, `c` code (verbatim), `n` a number (right-aligned)."""
    rows: list[tuple[str, ...]]


@dataclass(frozen=True)
class Section:
    title: str
    summary: str
    tables: list[Table] = field(default_factory=list)


def _item_row(lead: tuple[str, ...], i: Item) -> tuple[str, ...]:
    return (
        *lead,
        NAMES[i.item],
        value(i.item, i.old),
        value(i.item, i.new),
        delta(i.item, i.delta),
    )


def _fits(x: bool | None) -> str:
    return NONE if x is None else "fits" if x else "over budget"


def _where(line: int | None, by_option: bool = False) -> str:
    return "--set" if by_option else f"line {line}" if line else "default"


def diagnostics(side: SideReport) -> Section | None:
    if side.status == "ok":
        return None
    rows = [(m.severity, str(m.line or ""), m.code, m.message) for m in side.diagnostics]
    table = Table(("severity", "line", "code", "message"), "tntt", rows)
    return Section(f"{side.label}: {side.status}", count(len(rows), "diagnostic"), [table])


def settings(report: DiffReport) -> Section | None:
    if not report.settings:
        return None
    rows = [
        (s.setting, s.old or NONE, s.new or NONE,
         f"{_where(s.old_line)} → {_where(s.new_line, s.new_by_option)}")
        for s in report.settings
    ]  # fmt: skip
    table = Table(("setting", "old", "new", "where"), "ccct", rows)
    return Section("Settings", f"{len(rows)} changed", [table])


def memory(report: DiffReport) -> Section | None:
    m = report.memory
    if m is None or not (m.stages or m.params_total or m.budget_old != m.budget_new):
        return None
    rows = []
    if m.budget_old != m.budget_new:
        d = None if None in (m.budget_old, m.budget_new) else m.budget_new - m.budget_old
        budget = Item(item="budget_bytes", old=m.budget_old, new=m.budget_new, delta=d)
        rows.append(_item_row(("",), budget))
    if m.params_total:
        rows.append(_item_row(("",), m.params_total))
    for s in m.stages:
        rows += [_item_row((str(s.stage),), i) for i in s.items]
        rows.append((str(s.stage), "verdict", _fits(s.fits_old), _fits(s.fits_new), ""))
    table = Table(("stage", "item", "old", "new", "delta"), "ttnnn", rows)
    changed = [s for s in m.stages if s.change == "changed"]
    parts = [count(len(changed), "stage") + " changed"] if changed else []
    parts += [f"stage {s.stage} {s.change}" for s in m.stages if s.change != "changed"]
    return Section("Memory per device", ", ".join(parts) or "totals unchanged", [table])


def time(report: DiffReport) -> Section | None:
    t = report.time
    if t is None or not (t.items or t.stages):
        return None
    tables = []
    if t.items:
        tables.append(Table(("measure", "old", "new", "delta"), "tnnn",
                            [_item_row((), i) for i in t.items]))  # fmt: skip
    if t.stages:
        rows = [_item_row((str(s.stage),), i) for s in t.stages for i in s.terms]
        tables.append(Table(("stage", "term", "old", "new", "delta"), "ttnnn", rows))
    summary = next((f"step {delta(i.item, i.delta)}" for i in t.items if i.item == "step_s"), "")
    return Section("Step time", summary or "stage terms changed", tables)


def ops(report: DiffReport) -> Section | None:
    if not report.ops:
        return None
    rows = [(f"{o.graph}.{o.op}", o.aspect, o.old or NONE, o.new or NONE) for o in report.ops]
    n = len({(o.graph, o.op) for o in report.ops})
    return Section("Ops", f"{count(n, 'op')} changed",
                   [Table(("op", "aspect", "old", "new"), "ctcc", rows)])  # fmt: skip


def params(report: DiffReport) -> Section | None:
    if not report.params:
        return None
    rows = [(", ".join(p.params), p.aspect, p.old or NONE, p.new or NONE) for p in report.params]
    n = len({name for p in report.params for name in p.params})
    return Section("Parameters", f"{n} changed",
                   [Table(("parameters", "aspect", "old", "new"), "ctcc", rows)])  # fmt: skip


def files(report: DiffReport) -> Section | None:
    if not report.files:
        return None
    rows = [
        (
            f.path,
            f.change,
            str(f.old_lines),
            str(f.new_lines),
            f"+{f.added_lines}",
            f"-{f.removed_lines}",
        )
        for f in report.files
    ]
    table = Table(("file", "change", "old lines", "new lines", "added", "removed"), "ctnnnn", rows)
    return Section("Generated files", f"{count(len(rows), 'file')} changed", [table])


def sections(report: DiffReport) -> list[Section]:
    """The sections that have something to say, in the order a reviewer reads them."""
    found = [diagnostics(report.old), diagnostics(report.new)]
    found += [f(report) for f in (settings, memory, time, ops, params, files)]
    return [s for s in found if s is not None]
