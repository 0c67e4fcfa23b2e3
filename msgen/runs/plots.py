"""`msgen report --html / --svg`: the run's curves as SVG panels, computed here as
numbers and text and written by templates/report/*.j2, so the same run gives the
same bytes. The HTML is one file with nothing outside it (no script, style
sheet, image or font to fetch).

Panels: loss and validation loss; learning rate; gradient norm; loss scale; step
time and MFU with the prediction as a dashed line; peak memory against each
stage's estimate. A vertical red line marks each alarm on its panel.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from html import escape

from msgen.estimate.svg import nice_step
from msgen.resources import template
from msgen.runs.logs import Run, finite
from msgen.runs.output import RunReport

WIDTH, HEIGHT = 720, 230
LEFT, RIGHT, TOP, BOTTOM = 80, 150, 34, 40
MAX_POINTS = 2000  # a longer series keeps each bucket's lowest and highest point
GAP = 10
COLORS = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#9c755f", "#e15759")
ALARM_COLOR = "#d62728"
PANEL_ALARMS = {
    "loss": ("nonfinite_loss", "loss_spike", "valid_loss_rising", "skipped_updates"),
    "grad_norm": ("grad_norm_spike",),
    "step_time": ("slow_steps", "straggler"),
    "peak_memory": ("memory_growth",),
}


@dataclass
class Series:
    name: str
    points: list[tuple[int, float]]
    dashed: bool = False


@dataclass
class Panel:
    key: str
    title: str
    unit: str
    series: list[Series] = field(default_factory=list)
    alarms: list[int] = field(default_factory=list)


def by_step(run: Run, column: str, pick) -> list[tuple[int, float]]:
    """(step, pick(values of every rank at that step)) for the steps some rank logs."""
    values: dict[int, list[float]] = {}
    for r in run.ranks:
        for step, x in r.series(column):
            values.setdefault(step, []).append(x)
    return [(s, pick(v)) for s, v in sorted(values.items())]


def flat(value: float | None, steps: list[int]) -> list[tuple[int, float]]:
    return [] if value is None or not steps else [(steps[0], value), (steps[-1], value)]


def panels(run: Run, report: RunReport) -> list[Panel]:
    ref = run.rank(report.summary.rank)
    steps = [int(r["step"]) for r in ref.rows]
    c = report.predicted
    times = [
        Series("step time", ref.series("step_time")[1:]),  # step 1 compiles the graph
    ]
    if run.world > 1:
        times.append(Series("slowest rank", by_step(run, "step_time", max)[1:]))
    out = [
        Panel("loss", "loss", "nats", [Series("loss", ref.series("loss")),
                                       Series("validation", ref.series("valid_loss"))]),
        Panel("lr", "learning rate", "", [Series("lr", ref.series("lr"))]),
        Panel("grad_norm", "gradient norm (global)", "", [Series("grad norm", ref.series("grad_norm"))]),
        Panel("loss_scale", "loss scale", "", [Series("loss scale", ref.series("loss_scale"))]),
        Panel("step_time", "step time", "s", times),
        Panel("mfu", "MFU", "%", [Series("MFU", [(s, x * 100) for s, x in ref.series("mfu")])]),
        Panel("peak_memory", "peak memory per device", "GiB", [Series(
            f"rank {r.rank}", [(s, x / 2**30) for s, x in r.series("peak_memory_bytes") if x]
        ) for r in run.ranks[:4]]),
    ]  # fmt: skip
    if c is not None:
        panel = {p.key: p for p in out}
        if c.step_s:
            panel["step_time"].series.append(
                Series("predicted", flat(c.step_s.predicted, steps), True)
            )
        if c.mfu:
            panel["mfu"].series.append(
                Series("predicted", flat(c.mfu.predicted * 100, steps), True)
            )
        panel["peak_memory"].series += [
            Series(f"stage {v.stage} estimate", flat(v.predicted / 2**30, steps), True)
            for v in c.peak_bytes[:4]
        ]
    for p in out:
        p.series = [s for s in p.series if s.points]
        p.alarms = sorted({a.step for a in report.alarms if a.kind in PANEL_ALARMS.get(p.key, ())})
    return out


def thinned(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    if len(points) <= MAX_POINTS:
        return points
    size = -(-len(points) // (MAX_POINTS // 2))
    out = []
    for i in range(0, len(points), size):
        bucket = points[i : i + size]
        low, high = min(bucket, key=lambda p: p[1]), max(bucket, key=lambda p: p[1])
        out += sorted({low, high})
    return out


def pieces(points: list[tuple[int, float]]) -> list[list[tuple[int, float]]]:
    """The runs of finite values (a NaN breaks the line)."""
    out: list[list[tuple[int, float]]] = [[]]
    for p in points:
        if finite(p[1]):
            out[-1].append(p)
        elif out[-1]:
            out.append([])
    return [piece for piece in out if piece]


def f(x: float) -> str:
    return f"{x:.1f}"


def label(x: float) -> str:
    return f"{x:.6g}"


def drawing(p: Panel, y0: int) -> dict:
    """Every position and label of one panel, as text ready for the template."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    values = [v for s in p.series for _, v in s.points if finite(v)]
    steps = [st for s in p.series for st, _ in s.points] + p.alarms
    first, last = (min(steps), max(steps)) if steps else (0, 1)
    span_x = max(last - first, 1)
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    pad = (high - low) * 0.05 or abs(high) * 0.05 or 1.0
    low, high = low - pad, high + pad
    step_y = nice_step(high - low, 5)
    span_y = high - low

    def x(step: float) -> float:
        return LEFT + (step - first) / span_x * plot_w

    def y(value: float) -> float:
        return TOP + plot_h - (value - low) / span_y * plot_h

    ticks, tick = [], (low // step_y + 1) * step_y
    while tick <= high:
        ticks.append({"y": f(y(tick)), "label": label(round(tick, 12))})
        tick += step_y
    step_x = max(1, int(nice_step(span_x, 6)))
    xticks = [{"x": f(x(s)), "label": str(s)}
              for s in range((first // step_x + 1) * step_x, last + 1, step_x)]  # fmt: skip
    series = []
    for i, s in enumerate(p.series):
        lines = [" ".join(f"{f(x(a))},{f(y(b))}" for a, b in piece)
                 for piece in pieces(thinned(s.points))]  # fmt: skip
        series.append({"name": escape(s.name), "color": COLORS[i % len(COLORS)],
                       "dashed": s.dashed, "lines": lines,
                       "dots": [line for line in lines if " " not in line],
                       "legend_y": TOP + 14 + i * 18})  # fmt: skip
    empty = None if values else "not measured" if p.key == "peak_memory" else "no data"
    return {
        "key": p.key,
        "y0": y0,
        "width": WIDTH,
        "height": HEIGHT,
        "title": escape(p.title + (f" ({p.unit})" if p.unit else "")),
        "left": LEFT,
        "right": WIDTH - RIGHT,
        "top": TOP,
        "bottom": TOP + plot_h,
        "mid": f(TOP + plot_h / 2),
        "ticks": ticks,
        "xticks": xticks,
        "series": series,
        "alarms": [{"x": f(x(s)), "step": s} for s in p.alarms],
        "alarm_color": ALARM_COLOR,
        "legend_x": WIDTH - RIGHT + 12,
        "empty": empty,
    }


def render_svg(run: Run, report: RunReport) -> str:
    drawn = [drawing(p, i * (HEIGHT + GAP)) for i, p in enumerate(panels(run, report))]
    return template("report/report.svg.j2").render(
        panels=drawn, width=WIDTH, height=len(drawn) * (HEIGHT + GAP) - GAP
    )


def render_html(run: Run, report: RunReport, summary_text: str) -> str:
    drawn = [drawing(p, 0) for p in panels(run, report)]
    return template("report/report.html.j2").render(
        title=escape(f"msgen report: {report.run}"),
        healthy=report.healthy,
        alarms=[
            {"step": a.step, "ranks": escape(", ".join(map(str, a.ranks))), "kind": a.kind,
             "message": escape(a.message)}
            for a in report.alarms
        ],  # fmt: skip
        text=escape(summary_text),
        panels=drawn,
    )
