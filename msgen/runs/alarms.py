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

The work is linear in the rows: a spike's robust deviation is computed only for a
value above its level by more than k x the floor (below that no deviation makes it
a spike), and the alarms across ranks go through the steps once, in step order,
each step's times sorted once: O(ranks log ranks) a step, the median of the other
ranks read off the sorted times for each rank.
"""

from __future__ import annotations

import heapq
import math
from array import array
from bisect import bisect_left, insort
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import groupby, repeat
from operator import itemgetter
from statistics import median

from msgen.diagnostics import printable
from msgen.runs.logs import RankLog, Run, finite, spans

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
SPIKE_BLOCK = 64  # rows a spike search passes over at once when none can be a spike


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
    found = provenance_alarms(run) + timing_alarms(run, warm, t)
    for r in run.ranks:
        found += rank_alarms(r, warm, t)
    return merged(found)


def merged(alarms: list[Alarm]) -> list[Alarm]:
    """One alarm per kind and step, naming every rank it fired on (the first rank's
    message). Grouped in sorted order, with no table of every key: a log alarming on
    every other row holds half a million alarms."""
    out = []
    ordered = sorted(alarms, key=lambda a: (a.step, KINDS.index(a.kind), a.ranks))
    for _, group in groupby(ordered, key=lambda a: (a.step, a.kind)):
        first, *rest = group
        if rest:
            ranks = tuple(sorted({r for a in (first, *rest) for r in a.ranks}))
            first = Alarm(first.kind, first.step, ranks, first.message)
        out.append(first)
    return out


def streaks(flags: Iterable[bool], least: int = 1) -> Iterator[tuple[int, int]]:
    """(first, last) index of each run of True at least `least` long."""
    start, i = None, -1
    for i, flag in enumerate(flags):
        if flag:
            if start is None:
                start = i
        elif start is not None:
            if i - start >= least:
                yield start, i - 1
            start = None
    if start is not None and i + 1 - start >= least:
        yield start, i


def middle(values) -> float:
    """The median, as statistics.median takes it, without its checks (hot loops)."""
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def robust_high(value: float, history: list[float], t: Thresholds, k: float, floor):
    """The level `value` rose above when it is a spike, else None."""
    level = median(history[-t.level_rows :])
    changes = [b - a for a, b in zip(history, history[1:])]
    mid = median(changes)
    noise = ROBUST * median(abs(c - mid) for c in changes) / math.sqrt(2)
    deviation = max(noise, floor[0] * abs(level), floor[1])
    return level if value > level + k * deviation else None


def spikes(r: RankLog, column: str, warm: int, k: float, floor, t: Thresholds):
    """(row, level) of each row whose `column` is a spike above its level."""
    history: deque[float] = deque(maxlen=t.window)
    recent: deque[float] = deque(maxlen=t.level_rows)
    seen, steps = 0, r.steps  # finite values so far
    # The deviation is at least the floor, so a value within k floors of its level is
    # no spike; and level + k floors grows with the level (k x floor[0] < 1), which is
    # at least the lowest recent value: a value within k floors of that is none either.
    monotone = k * floor[0] < 1

    def bound(low: float) -> float:
        return low + k * max(floor[0] * abs(low), floor[1])

    values = r.numbers(column)
    for start in range(0, len(values), SPIKE_BLOCK):
        block = values[start : start + SPIKE_BLOCK]
        finite_values = list(filter(math.isfinite, block))
        if not finite_values:
            continue
        # A block whose highest value is within k floors of the lowest value any of
        # its levels can have (the block's and the 5 before it) holds no spike: bound
        # grows with its argument. Its values only go into the history, at C speed.
        if monotone and max(finite_values) <= bound(
            min(min(finite_values), min(recent, default=math.inf))
        ):
            history.extend(finite_values)
            recent.extend(finite_values)
            seen += len(finite_values)
            continue
        for i, value in enumerate(block, start):
            if not math.isfinite(value):
                continue
            if steps[i] > warm and seen >= t.min_history:
                low = min(recent)
                if not monotone or value > bound(low):
                    level = middle(recent)
                    if value > bound(level):
                        high = robust_high(value, list(history), t, k, floor)
                        if high is not None:
                            yield i, high
            history.append(value)
            recent.append(value)
            seen += 1


def rank_alarms(r: RankLog, warm: int, t: Thresholds) -> list[Alarm]:
    """The alarms one rank's log shows by itself."""
    out, steps = [], r.steps

    def fire(kind, found, message):
        for first, last in found:
            out.append(Alarm(kind, steps[first], (r.rank,), message(first, last)))

    def loss(i):
        return r.value("loss", i)

    # Each rule first asks at C speed whether its column holds a row it could fire on
    # (a healthy log's do not), and walks the rows only then.
    if not all(map(math.isfinite, r.numbers("loss"))):  # NaN also where a row has none
        fire("nonfinite_loss", streaks(x is not None and not math.isfinite(x)
                                       for x in r.values("loss")),
             lambda i, j: f"the loss is {loss(i):g}" + steps_to(steps, i, j))  # fmt: skip
    skipped = r.numbers("skipped")
    if any(map((1.0).__le__, skipped)):
        fire("skipped_updates", streaks(map((1.0).__le__, skipped), t.skipped_run),
             lambda i, j: f"{j - i + 1} updates in a row skipped (gradients not finite)"
             + steps_to(steps, i, j))  # fmt: skip
    for kind, column, k, floor in (
        ("loss_spike", "loss", t.loss_k, t.loss_floor),
        ("grad_norm_spike", "grad_norm", t.grad_k, t.grad_floor),
    ):
        levels = dict(spikes(r, column, warm, k, floor, t))
        fire(kind, runs_of(levels), lambda i, j, c=column, m=levels, k=k: (
            f"{c} {r.value(c, i):.4g}, more than {k:g} robust deviations above its "
            f"level {m[i]:.4g}"))  # fmt: skip
    out += valid_alarms(r, warm, t)

    peaks = r.numbers("peak_memory_bytes")

    def rises():
        before = math.nan  # no value (NaN) on either side is no rise: comparisons are false
        for i, now in enumerate(peaks):
            yield -math.inf < before < now < math.inf and steps[i] > warm
            before = now

    growth = streaks(rises(), t.memory_rises) if any(map(math.isfinite, peaks)) else ()
    fire("memory_growth", growth,
         lambda i, j: f"peak memory grew at {j - i + 1} steps in a row, "
         f"{r.value('peak_memory_bytes', i - 1) / 2**20:.1f} -> "
         f"{r.value('peak_memory_bytes', j) / 2**20:.1f} MiB" + steps_to(steps, i, j))  # fmt: skip
    return out


def runs_of(rows: Iterable[int]) -> Iterator[tuple[int, int]]:
    """(first, last) of each run of consecutive numbers in the increasing `rows`."""
    first = last = None
    for i in rows:
        if last is not None and i == last + 1:
            last = i
            continue
        if first is not None:
            yield first, last
        first = last = i
    if first is not None:
        yield first, last


def steps_to(steps, i: int, j: int) -> str:
    return "" if i == j else f" (steps {steps[i]}-{steps[j]})"


def valid_alarms(r: RankLog, warm: int, t: Thresholds) -> list[Alarm]:
    """Validation loss higher at `valid_rises` evaluations in a row while the training
    loss (the median of `trend_rows` rows up to an evaluation) fell over them; after
    that, again only once the validation loss has reached a new best."""
    rows, values, best = array("q"), array("d"), array("d")  # per evaluation
    for i, v in enumerate(r.numbers("valid_loss")):
        if math.isfinite(v):
            rows.append(i)
            values.append(v)
            best.append(min(v, best[-1]) if best else v)

    def train_loss(e: int) -> float | None:
        i = rows[e]
        recent = [r.value("loss", j) for j in range(max(0, i - t.trend_rows + 1), i + 1)]
        recent = [x for x in recent if finite(x)]
        return median(recent) if recent else None

    n = t.valid_rises

    def rising(e: int) -> bool:
        if e < n:
            return False
        a = e - n
        before, after = train_loss(a), train_loss(e)
        return (
            r.steps[rows[a]] > warm
            and rows[a] >= t.min_history
            and all(values[x] < values[x + 1] for x in range(a, e))
            and before is not None
            and after is not None
            and after < before
        )

    out, fired_at = [], None
    for first, last in streaks(rising(e) for e in range(len(rows))):
        start, end = first - n, last
        # Once it fired, it fires again only after a new best validation loss.
        if fired_at is not None and best[first - 1] >= best[fired_at - 1]:
            continue
        fired_at = last + 1
        step = r.steps
        out.append(Alarm("valid_loss_rising", step[rows[first - n + 1]], (r.rank,), (
            f"validation loss rose at {last - first + n} evaluations in a row, "
            f"{values[start]:.4g} at step {step[rows[start]]} -> {values[end]:.4g} at step "
            f"{step[rows[end]]}, while the training loss fell {train_loss(start):.4g} -> "
            f"{train_loss(end):.4g}"
        )))  # fmt: skip
    return out


def timed_steps(run: Run) -> Iterator[tuple[int, list[tuple[float, int]]]]:
    """(step, [(seconds, rank), ...] fastest first) for each step some rank timed, in
    step order; step 1 left out (the graph compiles then), and any time not above 0.
    One pass over every rank's step-time column at once: row by row when every rank
    logged the same steps (the usual run), else merged by step; memory for one step's
    times besides the columns."""
    columns = [r.numbers("step_time") for r in run.ranks]  # NaN: no time
    first = run.ranks[0].steps
    if len(columns) == 1:  # one rank: its times are the step's, nothing to sort
        rank = run.ranks[0].rank
        start = bisect_left(first, 2)
        for step, took in zip(first[start:], columns[0][start:]):
            if 0 < took < math.inf:
                yield step, [(took, rank)]
        return
    if all(r.steps == first for r in run.ranks):
        ranks = [r.rank for r in run.ranks]
        at_steps = ((step, zip(took, ranks)) for step, took in zip(first, zip(*columns)))
    else:
        logs = [zip(r.steps, took, repeat(r.rank)) for r, took in zip(run.ranks, columns)]
        merged = heapq.merge(*logs, key=itemgetter(0))
        at_steps = ((step, (x[1:] for x in at)) for step, at in groupby(merged, itemgetter(0)))
    for step, at_step in at_steps:
        if step > 1:
            times = sorted((took, rank) for took, rank in at_step if 0 < took < math.inf)
            if times:
                yield step, times


def others_median(times: list[tuple[float, int]], p: int) -> float:
    """The median of the sorted `times` without the one at `p`, read off in O(1)."""
    m = len(times) - 1

    def at(j: int) -> float:
        return times[j if j < p else j + 1][0]

    return at(m // 2) if m % 2 else (at(m // 2 - 1) + at(m // 2)) / 2


def timing_alarms(run: Run, warm: int, t: Thresholds) -> list[Alarm]:
    """Slow steps: the fastest rank slower than `slow_factor` x its trailing median,
    `consecutive` steps in a row. Stragglers: one rank slower than `straggler_factor`
    x the median of the others, `consecutive` of its steps in a row."""
    out: list[Alarm] = []
    fastest: deque[float] = deque()
    ordered: list[float] = []  # `fastest` sorted: the trailing median in O(window)
    slow = None  # the slow streak going on: [first step, ranks, median, last step, n, top]
    late: dict[int, list] = {}  # rank -> its straggler streak: [first, last, n, low, high]

    def slow_done():
        first, ranks, mid, last, n, top = slow
        if n >= t.consecutive:
            out.append(Alarm("slow_steps", first, ranks, (
                f"{n} steps in a row took more than {t.slow_factor:g}x the median "
                f"{mid:.4g} s on every rank (up to {top:.4g} s)"
                + (f" (steps {first}-{last})" if last > first else ""))))  # fmt: skip

    def late_done(rank: int):
        first, last, n, low, high = late.pop(rank)
        if n >= t.consecutive:
            out.append(Alarm("straggler", first, (rank,), (
                f"slower than the other ranks {n} steps in a row, {low:.2f}x to {high:.2f}x "
                f"their median (steps {first}-{last})")))  # fmt: skip

    least, factor, window = t.min_history, t.slow_factor, t.window  # locals: a loop per step
    for step, times in timed_steps(run):
        quickest = times[0][0]
        h = len(ordered)  # sorted already; its median is at least its lowest, ordered[0]
        if step > warm and h >= least and quickest > factor * ordered[0]:
            mid = ordered[h // 2] if h % 2 else (ordered[h // 2 - 1] + ordered[h // 2]) / 2
        else:
            mid = None
        if mid is not None and quickest > factor * mid:
            if slow is None:
                slow = [step, tuple(sorted(rank for _, rank in times)), mid, step, 0, quickest]
            slow[3:] = [step, slow[4] + 1, max(slow[5], quickest)]
        elif slow is not None:
            slow_done()
            slow = None
        fastest.append(quickest)
        insort(ordered, quickest)
        if h >= window:
            del ordered[bisect_left(ordered, fastest.popleft())]
        if len(times) == 1:
            continue  # no other rank to be slower than
        for p, (took, rank) in enumerate(times):
            ratio = took / others_median(times, p)
            if step > warm and ratio > t.straggler_factor:
                s = late.setdefault(rank, [step, step, 0, ratio, ratio])
                s[1:] = [step, s[2] + 1, min(s[3], ratio), max(s[4], ratio)]
            elif rank in late:
                late_done(rank)
    if slow is not None:
        slow_done()
    for rank in list(late):
        late_done(rank)
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
        usual, holders = {}, {}
        for key in sorted({k for v in values for k in v}):
            held = [v.get(key) for v in values]
            counts = Counter(held)
            usual[key] = max(held, key=lambda x: counts[x])  # the first of the most
            holders[key] = spans([r.rank for r, x in zip(with_json, held) if x == usual[key]])
        for r, v in zip(with_json, values):
            differ = [k for k in usual if v.get(k) != usual[k]]
            if differ:
                step = r.provenance.get("start_step", 0) + 1
                out.append(Alarm(kind, step, (r.rank,), "; ".join(
                    printable(f"{k} {v.get(k)} here, {usual[k]} on rank {holders[k]}")
                    for k in differ)))  # fmt: skip
    return out
