"""`msgen report --html / --svg`: the run's curves as SVG panels, computed here as
numbers and text and written by templates/report/*.j2, so the same run gives the
same bytes. The HTML is one file with nothing outside it (no script, style
sheet, image or font to fetch).

Panels: loss and validation loss; learning rate; gradient norm; loss scale; step
time and MFU with the prediction as a dashed line; peak memory against each
stage's estimate. A vertical red line marks each alarm on its panel.
"""

from __future__ import annotations

import heapq
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from html import escape
from itertools import groupby, islice
from operator import itemgetter

from msgen.estimate.svg import nice_step
from msgen.resources import template
from msgen.runs.logs import Run, finite
from msgen.runs.output import RunReport

WIDTH, HEIGHT = 720, 230
LEFT, RIGHT, TOP, BOTTOM = 80, 150, 34, 40
MAX_POINTS = 2000  # a longer series keeps each bucket's lowest and highest point
MAX_TICKS = 12  # an axis's labels, at most
RESOLUTION = 2**-40  # a spread below this share of the values' size is drawn flat
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
    points: list[tuple[int, float]]  # at most MAX_POINTS (thinned)
    dashed: bool = False


@dataclass
class Panel:
    key: str
    title: str
    unit: str
    series: list[Series] = field(default_factory=list)
    alarms: list[int] = field(default_factory=list)


def curve(name: str, points: Callable[[], Iterable[tuple[int, float]]]) -> Series:
    """A series from `points()` (called twice: to count, then to thin)."""
    return Series(name, thinned(points(), sum(1 for _ in points())))


def slowest(run: Run) -> Iterator[tuple[int, float]]:
    """(step, the slowest rank's step time) for the steps some rank timed."""
    logs = [r.series("step_time") for r in run.ranks]
    for step, at in groupby(heapq.merge(*logs, key=itemgetter(0)), key=itemgetter(0)):
        yield step, max(x for _, x in at)


def flat(value: float | None, steps: list[int]) -> list[tuple[int, float]]:
    return [] if value is None or not steps else [(steps[0], value), (steps[-1], value)]


def panels(run: Run, report: RunReport) -> list[Panel]:
    ref = run.rank(report.summary.rank)
    steps = [ref.steps[0], ref.steps[-1]] if ref.rows else []
    c = report.predicted

    def of(key: str, name: str, scale: float = 1.0) -> Series:
        return curve(name, lambda: ((s, x * scale) for s, x in ref.series(key)))

    times = [
        curve("step time", lambda: islice(ref.series("step_time"), 1, None))
    ]  # step 1 compiles
    if run.world > 1:
        times.append(curve("slowest rank", lambda: islice(slowest(run), 1, None)))
    out = [
        Panel("loss", "loss", "nats", [of("loss", "loss"), of("valid_loss", "validation")]),
        Panel("lr", "learning rate", "", [of("lr", "lr")]),
        Panel("grad_norm", "gradient norm (global)", "", [of("grad_norm", "grad norm")]),
        Panel("loss_scale", "loss scale", "", [of("loss_scale", "loss scale")]),
        Panel("step_time", "step time", "s", times),
        Panel("mfu", "MFU", "%", [of("mfu", "MFU", 100)]),
        Panel("peak_memory", "peak memory per device", "GiB", [curve(
            f"rank {r.rank}", lambda r=r: ((s, x / 2**30) for s, x in r.series("peak_memory_bytes")
                                           if x)
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


def thinned(points: Iterable[tuple[int, float]], count: int) -> list[tuple[int, float]]:
    """The `count` points, or past MAX_POINTS each bucket's lowest and highest."""
    if count <= MAX_POINTS:
        return list(points)
    size = -(-count // (MAX_POINTS // 2))
    out: list[tuple[int, float]] = []
    points = iter(points)
    while bucket := list(islice(points, size)):
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


def value_axis(values: list[float]) -> tuple[float, float]:
    """The value axis's ends: the values padded by 5% of their spread either side, or
    by 5% of their size when the spread is below what a float tells apart there; never
    past the largest float (values near it do not overflow)."""
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    half = high / 2 - low / 2  # half the spread: finite for any two finite values
    size = max(abs(low), abs(high))
    pad = (half * 0.1 if half > size * RESOLUTION else size * 0.05) or 1.0
    return max(low - pad, -sys.float_info.max), min(high + pad, sys.float_info.max)


def ticks_of(low: float, high: float, ticks: int) -> list[float]:
    """Nice values strictly above `low` up to `high`, about `ticks` of them: computed
    from their count, so a step below the values' resolution cannot loop."""
    step = nice_step(high / 2 - low / 2, ticks / 2)  # the span over two: no overflow
    first = int(low // step) + 1
    count = min(int(high // step) - first + 1, MAX_TICKS)
    return [k * step for k in range(first, first + max(count, 0))]


def drawing(p: Panel, y0: int) -> dict:
    """Every position and label of one panel, as text ready for the template."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    values = [v for s in p.series for _, v in s.points if finite(v)]
    steps = [st for s in p.series for st, _ in s.points] + p.alarms
    first, last = (min(steps), max(steps)) if steps else (0, 1)
    span_x = max(last - first, 1)
    low, high = value_axis(values)
    half = high / 2 - low / 2

    def x(step: float) -> float:
        return LEFT + (step - first) / span_x * plot_w

    def y(value: float) -> float:
        return TOP + plot_h - (value / 2 - low / 2) / half * plot_h

    ticks = [{"y": f(y(t)), "label": label(round(t, 12))} for t in ticks_of(low, high, 5)]
    step_x = max(1, int(nice_step(span_x, 6)))
    xticks = [{"x": f(x(s)), "label": str(s)}
              for s in range((first // step_x + 1) * step_x, last + 1, step_x)]  # fmt: skip
    series = []
    for i, s in enumerate(p.series):
        lines = [" ".join(f"{f(x(a))},{f(y(b))}" for a, b in piece)
                 for piece in pieces(s.points)]  # fmt: skip
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
        left_off=[escape(x.line()) for x in report.alarms_left_off],
        alarm_count=f"{report.alarm_count:,}",
        text=escape(summary_text),
        panels=drawn,
    )
