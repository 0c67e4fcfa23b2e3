"""What is wrong with a run, each finding with its step and rank.

The rules (docs/report.md, "Alarms", lists them with the thresholds below):

- A history alarm (loss or grad-norm spike, slow steps, rising validation loss,
  memory growth) never judges the warm-up, the first max(10, 5% of the run's
  steps) steps, and needs `min_history` earlier steps of its series. Step 1's
  time (the graph compiles) never counts.
- A spike is a value more than `k` robust deviations above the level: the
  median of the `level_rows` values before it. The deviation is that of the
  step-to-step changes over the `window` values before, 1.4826 x their median
  absolute deviation / sqrt(2) (the standard deviation of normal noise; the
  changes, not the values, so that a loss falling fast is not taken for
  noise), floored so that a flat curve does not turn rounding into spikes.
- Slow steps: the fastest rank took more than `slow_factor` x the median of its
  earlier steps, `consecutive` steps in a row (every rank waited). A straggler:
  one rank took more than `straggler_factor` x the median of the other ranks at
  the same step, `consecutive` steps in a row.
- A non-finite loss, a run of `skipped_run` skipped updates and ranks whose
  run.json differ fire from step 1.
- A condition that holds on consecutive steps is one alarm, at the first of
  them; the same alarm on several ranks at one step is one alarm naming them.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from statistics import median

from msgen.runs.logs import Run, finite, spans

KINDS = (
    "version_mismatch",
    "spec_mismatch",
    "nonfinite_loss",
    "skipped_updates",
    "loss_spike",
    "grad_norm_spike",
    "valid_loss_rising",
    "slow_steps",
    "straggler",
    "memory_growth",
)
ROBUST = 1.4826  # MAD x this = the standard deviation of normal noise


@dataclass(frozen=True)
class Thresholds:
    window: int = 50  # earlier steps a history alarm compares with
    min_history: int = 20  # earlier steps it needs at least
    warmup_steps: int = 10  # never judged: the first max(warmup_steps,
    warmup_share: float = 0.05  # warmup_share x the run's steps) steps
    level_rows: int = 5  # a spike's level: the median of this many values before it
    loss_k: float = 6.0  # robust deviations above the level
    loss_floor: tuple[float, float] = (0.02, 0.01)  # deviation >= 2% of the median, 0.01 nats
    grad_k: float = 6.0
    grad_floor: tuple[float, float] = (0.1, 0.0)  # deviation >= 10% of the median
    slow_factor: float = 1.5  # x the fastest rank's trailing median step time
    straggler_factor: float = 1.25  # x the median of the other ranks at that step
    consecutive: int = 3  # slow steps / straggler steps in a row
    skipped_run: int = 5  # skipped updates in a row (dynamic loss scale: 32x down)
    valid_rises: int = 3  # evaluations in a row, each higher than the one before
    trend_rows: int = 5  # training loss: the median of this many rows to an evaluation
    memory_rises: int = 5  # steps in a row, each peak higher than the one before

    def warmup(self, steps: int) -> int:
        return max(self.warmup_steps, math.ceil(self.warmup_share * steps))


DEFAULT = Thresholds()


@dataclass(frozen=True)
class Alarm:
    kind: str
    step: int
    ranks: tuple[int, ...]
    message: str

    @property
    def rank(self) -> int:
        return self.ranks[0]


def judge(run: Run, t: Thresholds = DEFAULT) -> list[Alarm]:
    """Every alarm of the run, by step, then kind, then rank."""
    warm = t.warmup(max(r.last_step for r in run.ranks))
    found = provenance_alarms(run) + slow_alarms(run, warm, t) + straggler_alarms(run, warm, t)
    for r in run.ranks:
        found += rank_alarms(r.rank, r.rows, warm, t)
    return merged(found)


def merged(alarms: list[Alarm]) -> list[Alarm]:
    """One alarm per kind and step, naming every rank it fired on."""
    by_key: dict[tuple[str, int], Alarm] = {}
    for a in sorted(alarms, key=lambda a: (a.step, KINDS.index(a.kind), a.ranks)):
        first = by_key.get((a.kind, a.step))
        ranks = tuple(sorted(set(a.ranks) | set(first.ranks if first else ())))
        by_key[(a.kind, a.step)] = Alarm(a.kind, a.step, ranks, (first or a).message)
    return list(by_key.values())


def streaks(flags: list[bool], least: int = 1) -> list[tuple[int, int]]:
    """(first, last) index of each run of True at least `least` long."""
    out, start = [], None
    for i, flag in enumerate([*flags, False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            if i - start >= least:
                out.append((start, i - 1))
            start = None
    return out


def robust_high(value: float, history: list[float], t: Thresholds, k: float, floor):
    """The level `value` rose above when it is a spike, else None."""
    level = median(history[-t.level_rows :])
    changes = [b - a for a, b in zip(history, history[1:])]
    mid = median(changes)
    noise = ROBUST * median(abs(c - mid) for c in changes) / math.sqrt(2)
    deviation = max(noise, floor[0] * abs(level), floor[1])
    return level if value > level + k * deviation else None


def spike_flags(rows, column, warm, k, floor, t) -> tuple[list[bool], list[float | None]]:
    """Per row: a spike in `column`, and the level it rose above."""
    history: list[float] = []
    flags, medians = [], []
    for row in rows:
        value, mid = row.get(column), None
        if finite(value):
            if row["step"] > warm and len(history) >= t.min_history:
                mid = robust_high(value, history[-t.window :], t, k, floor)
            history.append(value)
        flags.append(mid is not None)
        medians.append(mid)
    return flags, medians


def rank_alarms(rank: int, rows, warm: int, t: Thresholds) -> list[Alarm]:
    """The alarms one rank's log shows by itself."""
    out = []

    def fire(kind, flags, least, message):
        for first, last in streaks(flags, least):
            out.append(Alarm(kind, int(rows[first]["step"]), (rank,), message(first, last)))

    losses = [r.get("loss") for r in rows]
    fire("nonfinite_loss", [x is not None and not math.isfinite(x) for x in losses], 1,
         lambda i, j: f"the loss is {losses[i]:g}" + steps_to(rows, i, j))  # fmt: skip
    fire("skipped_updates", [(r.get("skipped") or 0) >= 1 for r in rows], t.skipped_run,
         lambda i, j: f"{j - i + 1} updates in a row skipped (gradients not finite)"
         + steps_to(rows, i, j))  # fmt: skip
    for kind, column, k, floor in (
        ("loss_spike", "loss", t.loss_k, t.loss_floor),
        ("grad_norm_spike", "grad_norm", t.grad_k, t.grad_floor),
    ):
        flags, mids = spike_flags(rows, column, warm, k, floor, t)
        fire(kind, flags, 1, lambda i, j, c=column, m=mids, k=k: (
            f"{c} {rows[i][c]:.4g}, more than {k:g} robust deviations above its "
            f"level {m[i]:.4g}"))  # fmt: skip
    out += valid_alarms(rank, rows, warm, t)
    memory = [r.get("peak_memory_bytes") for r in rows]
    rises = [
        i > 0 and rows[i]["step"] > warm and finite(memory[i]) and finite(memory[i - 1])
        and memory[i] > memory[i - 1]
        for i in range(len(rows))
    ]  # fmt: skip
    fire("memory_growth", rises, t.memory_rises,
         lambda i, j: f"peak memory grew at {j - i + 1} steps in a row, "
         f"{memory[i - 1] / 2**20:.1f} -> {memory[j] / 2**20:.1f} MiB" + steps_to(rows, i, j))  # fmt: skip
    return out


def steps_to(rows, i: int, j: int) -> str:
    return "" if i == j else f" (steps {int(rows[i]['step'])}-{int(rows[j]['step'])})"


def valid_alarms(rank: int, rows, warm: int, t: Thresholds) -> list[Alarm]:
    """Validation loss higher at `valid_rises` evaluations in a row while the training
    loss (the median of `trend_rows` rows up to an evaluation) fell over them; after
    that, again only once the validation loss has reached a new best."""
    at = {int(r["step"]): i for i, r in enumerate(rows)}
    evals = [(int(r["step"]), r["valid_loss"]) for r in rows if finite(r.get("valid_loss"))]

    def train_loss(step: int) -> float | None:
        i = at[step]
        recent = [r["loss"] for r in rows[max(0, i - t.trend_rows + 1) : i + 1]]
        recent = [x for x in recent if finite(x)]
        return median(recent) if recent else None

    n = t.valid_rises
    flags = []
    for i, (step, _) in enumerate(evals):
        window = evals[i - n : i + 1] if i >= n else []
        before, after = (train_loss(window[0][0]), train_loss(step)) if window else (None, None)
        flags.append(
            bool(window)
            and window[0][0] > warm
            and at[window[0][0]] >= t.min_history
            and all(a[1] < b[1] for a, b in zip(window, window[1:]))
            and before is not None
            and after is not None
            and after < before
        )
    out, fired_at = [], None
    for first, last in streaks(flags):
        start, end = evals[first - n], evals[last]
        # Once it fired, it fires again only after a new best validation loss.
        if fired_at is not None and min(v for _, v in evals[fired_at:first]) >= min(
            v for _, v in evals[:fired_at]
        ):
            continue
        fired_at = last + 1
        out.append(Alarm("valid_loss_rising", evals[first - n + 1][0], (rank,), (
            f"validation loss rose at {last - first + n} evaluations in a row, "
            f"{start[1]:.4g} at step {start[0]} -> {end[1]:.4g} at step {end[0]}, "
            f"while the training loss fell {train_loss(start[0]):.4g} -> {train_loss(end[0]):.4g}"
        )))  # fmt: skip
    return out


def step_times(run: Run) -> dict[int, dict[int, float]]:
    """{step: {rank: seconds}}, step 1 left out (the graph compiles then)."""
    out: dict[int, dict[int, float]] = {}
    for r in run.ranks:
        for step, took in r.series("step_time"):
            if step > 1 and finite(took):
                out.setdefault(step, {})[r.rank] = took
    return dict(sorted(out.items()))


def slow_alarms(run: Run, warm: int, t: Thresholds) -> list[Alarm]:
    """The fastest rank slower than `slow_factor` x its trailing median, in a row."""
    times = step_times(run)
    steps = list(times)
    fastest = [min(times[s].values()) for s in steps]
    flags, mids = [], []
    for i, step in enumerate(steps):
        history = fastest[max(0, i - t.window) : i]
        mid = median(history) if len(history) >= t.min_history else None
        flags.append(step > warm and mid is not None and fastest[i] > t.slow_factor * mid)
        mids.append(mid)
    return [
        Alarm("slow_steps", steps[i], tuple(sorted(times[steps[i]])), (
            f"{j - i + 1} steps in a row took more than {t.slow_factor:g}x the median "
            f"{mids[i]:.4g} s on every rank (up to {max(fastest[i : j + 1]):.4g} s)"
            + (f" (steps {steps[i]}-{steps[j]})" if j > i else "")))  # fmt: skip
        for i, j in streaks(flags, t.consecutive)
    ]


def straggler_alarms(run: Run, warm: int, t: Thresholds) -> list[Alarm]:
    """One rank slower than `straggler_factor` x the median of the others, in a row."""
    times = step_times(run)
    out = []
    for r in run.ranks:
        steps = [s for s, by_rank in times.items() if r.rank in by_rank and len(by_rank) > 1]
        ratios = [
            times[s][r.rank] / median(v for k, v in times[s].items() if k != r.rank) for s in steps
        ]
        flags = [s > warm and x > t.straggler_factor for s, x in zip(steps, ratios)]
        for i, j in streaks(flags, t.consecutive):
            out.append(Alarm("straggler", steps[i], (r.rank,), (
                f"slower than the other ranks {j - i + 1} steps in a row, "
                f"{min(ratios[i : j + 1]):.2f}x to {max(ratios[i : j + 1]):.2f}x their median"
                f" (steps {steps[i]}-{steps[j]})")))  # fmt: skip
    return out


def provenance_alarms(run: Run) -> list[Alarm]:
    """Ranks whose run.json (newest segment) differs from what most ranks hold (a tie:
    the lowest rank's), in the software versions or in the spec and generated tree."""
    with_json = [r for r in run.ranks if r.provenance]
    out = []
    for kind, fields in (
        ("version_mismatch", lambda p: dict(p.get("versions") or {})),
        ("spec_mismatch", lambda p: {
            "spec sha256": (p.get("spec") or {}).get("sha256"),
            "manifest sha256": p.get("manifest_sha256")}),  # fmt: skip
    ):
        values = [fields(r.provenance) for r in with_json]
        usual = {}
        for key in sorted({k for v in values for k in v}):
            held = [v.get(key) for v in values]
            counts = Counter(map(repr, held))
            usual[key] = max(held, key=lambda x: counts[repr(x)])  # the first of the most
        for r, v in zip(with_json, values):
            differ = [k for k in usual if v.get(k) != usual[k]]
            if differ:
                step = int(r.provenance.get("start_step") or 0) + 1
                out.append(Alarm(kind, step, (r.rank,), "; ".join(
                    f"{k} {v.get(k)} here, {usual[k]} on rank "
                    + spans([q.rank for q, w in zip(with_json, values) if w.get(k) == usual[k]])
                    for k in differ)))  # fmt: skip
    return out
