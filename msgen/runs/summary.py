"""A run in numbers, and held against the estimate of its spec.

The summary reads the reference rank: the lowest rank that logs a loss (the
last pipeline stage's first rank, the one train.py prints from). Times,
tokens/s and MFU are medians over the timed steps: those after the warm-up
(alarms.Thresholds.warmup) when there are any, else every step but step 1
(the graph compiles in it).

Predicted against measured goes through the compiler's one entry point and the
estimate modules (the numbers `msgen estimate --json` prints); each ratio is
measured / predicted.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from statistics import median, quantiles

from msgen.diagnostics import printable
from msgen.ir.mesh import RankMesh
from msgen.runs.alarms import DEFAULT, Thresholds
from msgen.runs.logs import RankLog, Run, finite

TREND_STEPS = 50  # the loss trend is the least-squares slope over this many last steps


@dataclass(frozen=True)
class Summary:
    rank: int  # the reference rank
    steps: int
    tokens: int | None
    loss: float | None
    loss_trend_per_100_steps: float | None
    valid_loss: float | None
    valid_step: int | None
    skipped: int
    timed_from: int  # the first timed step
    step_time_s: float | None
    step_time_p10_s: float | None
    step_time_p90_s: float | None
    tokens_per_s_per_device: float | None
    mfu: float | None
    peak_memory_bytes: int | None  # the largest over steps and ranks; None on the CPU


def reference(run: Run) -> RankLog:
    return next((r for r in run.ranks if any(map(math.isfinite, r.numbers("loss")))),
                run.ranks[0])  # fmt: skip


def timed_from(rank: RankLog, t: Thresholds) -> int:
    warm = t.warmup(rank.last_step)
    return warm + 1 if rank.last_step > warm else min(2, rank.last_step)


def slope(points: list[tuple[int, float]]) -> float | None:
    """The least-squares slope of value over step."""
    if len(points) < 2:
        return None
    mx = sum(s for s, _ in points) / len(points)
    my = sum(v for _, v in points) / len(points)
    sxx = sum((s - mx) ** 2 for s, _ in points)
    return sum((s - mx) * (v - my) for s, v in points) / sxx


def mid(values: list[float]) -> float | None:
    return median(values) if values else None


def last_finite(r: RankLog, column: str, n: int = 1) -> list[tuple[int, float]]:
    """The last `n` (step, value) of the rows with a finite value in `column`, in order."""
    out = []
    for i in range(r.rows - 1, -1, -1):
        if len(out) == n:
            break
        x = r.value(column, i)
        if finite(x):
            out.append((r.steps[i], x))
    return out[::-1]


def tokens_per_step(run: Run) -> int | None:
    """run.json's, when a rank has one."""
    known = [r.provenance.get("tokens_per_step") for r in run.ranks if r.provenance]
    return next((n for n in known if n is not None), None)


def summarize(run: Run, t: Thresholds = DEFAULT, per_step: int | None = None) -> Summary:
    """`per_step`: tokens per step when run.json does not say (from the spec)."""
    ref = reference(run)
    losses = last_finite(ref, "loss", TREND_STEPS)
    valid = last_finite(ref, "valid_loss")
    first = timed_from(ref, t)
    start = bisect_left(ref.steps, first)

    def column(name: str) -> list[float]:
        """The column's finite values over the timed steps, sorted (one list at a time:
        a long log's column is some 40 bytes a row as floats)."""
        return sorted(filter(math.isfinite, ref.numbers(name, start)))

    times = column("step_time")
    step_time = mid(times)
    cuts = quantiles(times, n=10, method="inclusive") if len(times) > 1 else None
    del times
    speed = mid(column("tokens_per_s"))
    mfu = mid(column("mfu"))
    memory = max((x for r in run.ranks for x in filter(math.isfinite, r.numbers(
        "peak_memory_bytes")) if x > 0), default=None)  # fmt: skip
    per_step = tokens_per_step(run) or per_step
    trend = slope(losses)
    return Summary(
        rank=ref.rank,
        steps=ref.last_step,
        tokens=per_step * ref.last_step if per_step else None,
        loss=losses[-1][1] if losses else None,
        loss_trend_per_100_steps=None if trend is None else trend * 100,
        valid_loss=valid[-1][1] if valid else None,
        valid_step=valid[-1][0] if valid else None,
        # a row is a step's update; NaN (no value) is not >= 1
        skipped=sum(map((1.0).__le__, ref.numbers("skipped"))),
        timed_from=first,
        step_time_s=step_time,
        step_time_p10_s=cuts[0] if cuts else step_time,
        step_time_p90_s=cuts[-1] if cuts else step_time,
        tokens_per_s_per_device=None if speed is None else speed / run.world,
        mfu=mfu,
        peak_memory_bytes=None if memory is None else int(memory),
    )


@dataclass(frozen=True)
class Versus:
    """Predicted against measured; `ratio` is measured / predicted."""

    predicted: float
    measured: float | None

    @property
    def ratio(self) -> float | None:
        return (
            None if self.measured is None or not self.predicted else self.measured / self.predicted
        )


@dataclass(frozen=True)
class Comparison:
    spec: str
    sets: tuple[str, ...]  # the --set flags the spec was analysed with (the run's tree's)
    device: str
    devices: int
    run_device: str | None  # what the run computed on (run.json's device_target)
    same_device: bool | None  # the run's device is the spec's kind; None: not recorded
    step_s: Versus | None
    tokens_per_s_per_device: Versus | None
    mfu: Versus | None
    peak_bytes: tuple[tuple[int, Versus], ...]  # per stage
    notes: tuple[str, ...]


def stage_peaks(run: Run, mesh: RankMesh) -> dict[int, int]:
    """The largest measured peak memory of each stage's ranks."""
    out: dict[int, int] = {}
    for r in run.ranks:
        for _, x in r.series("peak_memory_bytes"):
            if finite(x) and x > 0:
                stage = mesh.stage_of(r.rank)
                out[stage] = max(out.get(stage, 0), int(x))
    return out


@dataclass(frozen=True)
class Prediction:
    """What `msgen estimate` predicts for the spec."""

    spec: str
    sha256: str
    sets: tuple[str, ...]
    device: str
    target: str  # MindSpore's device_target of `device` ("" when not in the catalogue)
    devices: int
    mesh: RankMesh
    tokens_per_step: int
    step_s: float | None
    tokens_per_s_per_device: float | None
    mfu: float | None
    stage_bytes: tuple[int, ...]


def predict(result, device=None) -> Prediction:
    """The estimate of the analysed spec `result` (msgen.compiler.Result, estimable);
    `device` replaces the catalogue's (a calibration)."""
    from msgen.analysis.plan import Plan
    from msgen.estimate.flops import tokens_per_step as spec_tokens
    from msgen.estimate.memory import estimate
    from msgen.estimate.time import step_time

    spec = result.spec
    plan = Plan(spec, result.facts)
    est = estimate(plan)
    timing = step_time(plan, est, device)
    mesh = RankMesh.of(spec)
    return Prediction(
        spec=result.file,
        sha256=spec.sha256,
        sets=result.sets,
        device=est.device.name if est.device else "",
        target=est.device.target if est.device else "",
        devices=mesh.devices,
        mesh=mesh,
        tokens_per_step=spec_tokens(plan),
        step_s=timing.step_s if timing else None,
        tokens_per_s_per_device=timing.tokens_per_s_per_device if timing else None,
        mfu=timing.mfu if timing else None,
        stage_bytes=tuple(s.total_bytes for s in est.stages),
    )


def run_device(run: Run) -> str | None:
    """The device_target the run's run.json records (a rank's, the reference first)."""
    found = [(r.provenance or {}).get("device_target") for r in run.ranks]
    return next((d for d in found if isinstance(d, str) and d), None)


def compare(run: Run, summary: Summary, p: Prediction) -> Comparison:
    notes = []
    ran_on = run_device(run)
    same = None if ran_on is None or not p.target else ran_on == p.target
    if same is False:
        notes.append(
            f"the run ran on {printable(ran_on)}, the prediction is for {p.device} ({p.target}): the "
            "ratios below compare different devices"
        )
    hashes = {(r.provenance.get("spec") or {}).get("sha256") for r in run.ranks if r.provenance}
    if hashes - {None, p.sha256}:
        notes.append(f"the run was trained from another version of {p.spec} (sha256 differs)")
    if run.world != p.devices:
        notes.append(
            f"the run had {run.world} process{'es' if run.world > 1 else ''}, the spec's mesh "
            f"{p.devices} devices: the prediction is for the mesh"
        )
    if p.step_s is None:
        notes.append(f"no step-time model for {p.device or 'this device'}")
    peaks = stage_peaks(run, p.mesh) if run.world == p.devices else {}

    def versus(predicted, measured):
        return Versus(predicted, measured) if predicted is not None else None

    return Comparison(
        spec=p.spec,
        sets=p.sets,
        device=p.device,
        devices=p.devices,
        run_device=ran_on,
        same_device=same,
        step_s=versus(p.step_s, summary.step_time_s),
        tokens_per_s_per_device=versus(p.tokens_per_s_per_device, summary.tokens_per_s_per_device),
        mfu=versus(p.mfu, summary.mfu),
        peak_bytes=tuple((i, Versus(b, peaks.get(i))) for i, b in enumerate(p.stage_bytes)),
        notes=tuple(notes),
    )
