"""`msgen estimate --svg`: one stacked bar per pipeline stage, the budget as a
line, the fragmentation headroom hatched on top of each stack; with the
step-time model, its summary under the title and each stage's time terms on
its label (hover).

Plain SVG text built from the estimate alone: the same estimate gives the same
bytes.
"""

from __future__ import annotations

from html import escape
from math import floor, log10

from msgen.estimate.memory import Estimate, GiB
from msgen.estimate.report import ROWS, gib
from msgen.estimate.time import StepTime
from msgen.estimate.time_report import TERMS, seconds, summary

COLORS = {
    "weights_bytes": "#4e79a7",
    "grads_bytes": "#f28e2b",
    "accumulation_bytes": "#e15759",
    "optimizer_bytes": "#76b7b2",
    "activations_bytes": "#59a14f",
    "other_activations_bytes": "#edc948",
    "logits_bytes": "#b07aa1",
    "hccl_bytes": "#9c755f",
}
BUDGET_COLOR = "#d62728"
LEFT, TOP, PLOT_H, BOTTOM, LEGEND_W = 80, 50, 360, 60, 200


def nice_step(top: float, ticks: int = 8) -> float:
    """A 1, 2 or 5 times a power of ten step giving at most `ticks` ticks."""
    raw = top / ticks
    base = 10 ** floor(log10(raw))
    return next(m * base for m in (1, 2, 5, 10) if m * base >= raw)


def f(x: float) -> str:
    return f"{x:.1f}"


def render_svg(est: Estimate, timing: StepTime | None = None) -> str:
    stages = est.stages
    slot = max(14, min(80, 640 // len(stages)))
    bar = slot * 0.7
    plot_w = slot * len(stages)
    title = f"{est.model}: memory per device by pipeline stage"
    width = max(LEFT + plot_w + 30 + LEGEND_W, LEFT + 9 * len(title))
    height = TOP + PLOT_H + BOTTOM
    peak = max(s.total_bytes + s.headroom_bytes for s in stages)
    top = max(peak, est.budget_bytes or 0) / GiB * 1.08 or 1.0
    step = nice_step(top)

    def y(gib_value: float) -> float:
        return TOP + PLOT_H - gib_value / top * PLOT_H

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        "<defs>",
        '<pattern id="headroom" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)">'
        '<line x1="0" y1="0" x2="0" y2="6" stroke="#888888" stroke-width="2"/></pattern>',
        "</defs>",
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{LEFT}" y="24" font-size="15" font-weight="bold">{escape(title)}</text>',
    ]
    if timing is not None:
        out.append(f'<text x="{LEFT}" y="40" font-size="11">{escape(summary(timing))}</text>')
    tick = 0.0
    while tick <= top:
        ty = f(y(tick))
        out.append(f'<line x1="{LEFT}" y1="{ty}" x2="{LEFT + plot_w}" y2="{ty}" stroke="#e0e0e0"/>')
        out.append(f'<text x="{LEFT - 6}" y="{ty}" text-anchor="end" dy="4">{tick:g}</text>')
        tick = round(tick + step, 10)
    mid = f(TOP + PLOT_H / 2)
    out.append(
        f'<text x="20" y="{mid}" text-anchor="middle" transform="rotate(-90 20 {mid})">'
        "GiB per device</text>"
    )
    label_every = max(1, len(stages) // 16)
    for i, s in enumerate(stages):
        x = LEFT + i * slot + (slot - bar) / 2
        base = 0
        for key, name in ROWS:
            value = getattr(s, key)
            if not value:
                continue
            y0, y1 = y((base + value) / GiB), y(base / GiB)
            out.append(
                f'<rect x="{f(x)}" y="{f(y0)}" width="{f(bar)}" height="{f(y1 - y0)}" '
                f'fill="{COLORS[key]}"><title>stage {s.stage} {name}: {gib(value)} GiB'
                "</title></rect>"
            )
            base += value
        y0, y1 = y((base + s.headroom_bytes) / GiB), y(base / GiB)
        out.append(
            f'<rect x="{f(x)}" y="{f(y0)}" width="{f(bar)}" height="{f(y1 - y0)}" '
            f'fill="url(#headroom)" stroke="#888888" stroke-width="0.5">'
            f"<title>stage {s.stage} headroom (not added): {gib(s.headroom_bytes)} GiB</title>"
            "</rect>"
        )
        if i % label_every == 0:
            terms = ""
            if timing is not None:
                st = timing.stages[i]
                parts = ", ".join(f"{name} {seconds(getattr(st, key))}" for key, name in TERMS)
                terms = f"<title>stage {s.stage}: {escape(parts)}</title>"
            out.append(
                f'<text x="{f(x + bar / 2)}" y="{TOP + PLOT_H + 16}" '
                f'text-anchor="middle">{terms}{s.stage}</text>'
            )
    out.append(
        f'<line x1="{LEFT}" y1="{TOP + PLOT_H}" x2="{LEFT + plot_w}" y2="{TOP + PLOT_H}" '
        'stroke="#000000"/>'
    )
    out.append(f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + PLOT_H}" stroke="#000000"/>')
    out.append(
        f'<text x="{f(LEFT + plot_w / 2)}" y="{TOP + PLOT_H + 40}" text-anchor="middle">'
        "pipeline stage</text>"
    )
    if est.budget_bytes is not None:
        by = f(y(est.budget_bytes / GiB))
        out.append(
            f'<line x1="{LEFT}" y1="{by}" x2="{LEFT + plot_w}" y2="{by}" '
            f'stroke="{BUDGET_COLOR}" stroke-width="2" stroke-dasharray="6 4"/>'
        )
    legend_x = LEFT + plot_w + 30
    entries = [(f'fill="{COLORS[key]}"', name) for key, name in ROWS]
    entries.append(('fill="url(#headroom)" stroke="#888888"', "headroom (10%, not added)"))
    for i, (fill, name) in enumerate(reversed(entries)):
        ly = TOP + i * 20
        out.append(f'<rect x="{legend_x}" y="{ly}" width="14" height="14" {fill}/>')
        out.append(f'<text x="{legend_x + 20}" y="{ly + 11}">{escape(name)}</text>')
    if est.budget_bytes is not None:
        ly = TOP + len(entries) * 20 + 7
        out.append(
            f'<line x1="{legend_x}" y1="{ly}" x2="{legend_x + 14}" y2="{ly}" '
            f'stroke="{BUDGET_COLOR}" stroke-width="2" stroke-dasharray="6 4"/>'
        )
        out.append(
            f'<text x="{legend_x + 20}" y="{ly + 4}">budget {gib(est.budget_bytes)} GiB</text>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"
