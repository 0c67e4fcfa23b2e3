"""`msgen estimate --svg`: one stacked bar per pipeline stage, the budget as a
line, the fragmentation headroom hatched on top of each stack; with the
step-time model, its summary under the title and each stage's time terms on
its label (hover).

The drawing is computed here as numbers and text, and written by the template
templates/estimate.svg.j2: the same estimate gives the same bytes.
"""

from __future__ import annotations

from html import escape
from math import floor, log10

from msgen.estimate.memory import Estimate, GiB
from msgen.estimate.report import ROWS, gib
from msgen.estimate.time import StepTime
from msgen.estimate.time_report import TERMS, MoeValidation, moe_verdict, seconds, summary
from msgen.resources import template

COLORS = {
    "weights_bytes": "#4e79a7",
    "grads_bytes": "#f28e2b",
    "accumulation_bytes": "#e15759",
    "optimizer_bytes": "#76b7b2",
    "activations_bytes": "#59a14f",
    "other_activations_bytes": "#edc948",
    "logits_bytes": "#b07aa1",
    "recompute_working_bytes": "#ff9da7",
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


def render_svg(
    est: Estimate, timing: StepTime | None = None, moe: MoeValidation | None = None
) -> str:
    """The drawing as numbers (`drawing`), then templates/estimate.svg.j2."""
    return template("estimate.svg.j2").render(**drawing(est, timing, moe))


def drawing(
    est: Estimate, timing: StepTime | None = None, moe: MoeValidation | None = None
) -> dict:
    """Every position and label of the SVG, as text ready for the template."""
    stages = est.stages
    slot = max(14, min(80, 640 // len(stages)))
    bar = slot * 0.7
    plot_w = slot * len(stages)
    title = f"{est.model}: memory per device by pipeline stage"
    width = max(LEFT + plot_w + 30 + LEGEND_W, LEFT + 9 * len(title))
    peak = max(s.total_bytes + s.headroom_bytes for s in stages)
    top = max(peak, est.budget_bytes or 0) / GiB * 1.08 or 1.0
    step = nice_step(top)

    def y(gib_value: float) -> float:
        return TOP + PLOT_H - gib_value / top * PLOT_H

    ticks = []
    tick = 0.0
    while tick <= top:
        ticks.append({"y": f(y(tick)), "label": f"{tick:g}"})
        tick = round(tick + step, 10)
    label_every = max(1, len(stages) // 16)
    bars = []
    for i, s in enumerate(stages):
        x = LEFT + i * slot + (slot - bar) / 2
        base = 0
        parts = []
        for key, name in ROWS:
            value = getattr(s, key)
            if not value:
                continue
            y0, y1 = y((base + value) / GiB), y(base / GiB)
            parts.append(
                {"y": f(y0), "height": f(y1 - y0), "color": COLORS[key], "name": name,
                 "gib": gib(value)}
            )  # fmt: skip
            base += value
        y0, y1 = y((base + s.headroom_bytes) / GiB), y(base / GiB)
        terms = None
        if timing is not None:
            st = timing.stages[i]
            terms = escape(", ".join(f"{n} {seconds(getattr(st, k))}" for k, n in TERMS))
        bars.append(
            {
                "stage": s.stage,
                "x": f(x),
                "width": f(bar),
                "center": f(x + bar / 2),
                "parts": parts,
                "headroom": {"y": f(y0), "height": f(y1 - y0), "gib": gib(s.headroom_bytes)},
                "labelled": i % label_every == 0,
                "terms": terms,
            }
        )
    entries = [(f'fill="{COLORS[key]}"', name) for key, name in ROWS]
    entries.append(('fill="url(#headroom)" stroke="#888888"', "headroom (10%, not added)"))
    budget = None
    if est.budget_bytes is not None:
        budget = {
            "y": f(y(est.budget_bytes / GiB)),
            "legend_y": TOP + len(entries) * 20 + 7,
            "gib": gib(est.budget_bytes),
        }
    return {
        "width": width,
        "height": TOP + PLOT_H + BOTTOM,
        "title": escape(title),
        "summary": escape(summary(timing) + moe_verdict(moe)) if timing is not None else None,
        "left": LEFT,
        "right": LEFT + plot_w,
        "top": TOP,
        "bottom": TOP + PLOT_H,
        "tick_x": LEFT - 6,
        "ticks": ticks,
        "mid": f(TOP + PLOT_H / 2),
        "bars": bars,
        "label_y": TOP + PLOT_H + 16,
        "axis_x": f(LEFT + plot_w / 2),
        "axis_y": TOP + PLOT_H + 40,
        "budget": budget,
        "budget_color": BUDGET_COLOR,
        "legend_x": LEFT + plot_w + 30,
        "legend": [
            {"y": TOP + i * 20, "fill": fill, "name": escape(name)}
            for i, (fill, name) in enumerate(reversed(entries))
        ],
    }
