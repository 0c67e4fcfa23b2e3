"""The history alarms against their rules computed the slow way, row by row, as
docs/report.md states them: a spike (loss, gradient norm) and slow steps on one rank.
msgen/runs/alarms.py passes over blocks of rows none of which can fire, and reads a
one-rank run's times without sorting; the oracle here does neither, so a shortcut that
passes over a row that fires shows. Logs are made with a seed: a falling loss with noise
of several sizes, spikes, gaps (no value, NaN, inf), negative values, slow stretches.
No MindSpore.
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from statistics import median

import pytest

from msgen.runs.alarms import DEFAULT, ROBUST, judge
from msgen.runs.logs import read_run

HEADER = (
    "step,loss,perplexity,lr,grad_norm,loss_scale,skipped,tokens_per_s,step_time,mfu,"
    "valid_loss,valid_perplexity,peak_memory_bytes\n"
)
ROWS = 4000


def text(x) -> str:
    return x if isinstance(x, str) else f"{x:.6g}"


def write_log(folder: Path, seed: int) -> Path:
    rng = random.Random(seed)
    noise = rng.choice([0.001, 0.01, 0.05])
    lines = [HEADER]
    for s in range(1, ROWS + 1):
        loss = 5 / (1 + s / 300) + rng.gauss(0, noise) - (3 if seed % 2 and s > 2000 else 0)
        if rng.random() < 0.01:
            loss += rng.choice([0.5, 2, 20]) * abs(loss)
        grad = 1.5 + rng.gauss(0, 0.1) + (5 if rng.random() < 0.01 else 0)
        took = 0.128 * rng.uniform(0.95, 1.05) * (2 if s % 400 in range(100, 100 + s % 7) else 1)
        row = [loss, grad, took]
        for j in range(3):
            if rng.random() < 0.005:
                row[j] = rng.choice(["", "nan", "inf", "-inf"])
        loss, grad, took = map(text, row)
        lines.append(f"{s},{loss},1,0.0003,{grad},65536,0,2000,{took},0.4,,,\n")
    (folder / "rank_0").mkdir(parents=True)
    (folder / "rank_0" / "log.csv").write_text("".join(lines))
    return folder


def column(folder: Path, name: str) -> list[float]:
    header, *rows = (folder / "rank_0" / "log.csv").read_text().splitlines()
    at = header.split(",").index(name)
    return [float(r.split(",")[at] or "nan") for r in rows]


def streak_starts(flags: list[tuple[int, bool]], least: int) -> list[int]:
    """The step starting each run of at least `least` consecutive True."""
    out, run = [], []
    for step, flag in flags + [(None, False)]:
        if flag:
            run.append(step)
            continue
        if len(run) >= least:
            out.append(run[0])
        run = []
    return out


def spike_steps(values: list[float], k: float, floor: tuple[float, float]) -> list[int]:
    """docs/report.md's spike rule at every row: the level is the median of the 5 finite
    values before, the deviation 1.4826 x the median absolute deviation of the changes
    over the 50 before / sqrt(2), floored; judged after the warm-up with 20 before."""
    warm = DEFAULT.warmup(ROWS)
    flags, before = [], []
    for step, v in enumerate(values, 1):
        if not math.isfinite(v):
            continue
        fired = False
        if step > warm and len(before) >= DEFAULT.min_history:
            window = before[-DEFAULT.window :]
            level = median(window[-DEFAULT.level_rows :])
            changes = [b - a for a, b in zip(window, window[1:])]
            mid = median(changes)
            noise = ROBUST * median(abs(c - mid) for c in changes) / math.sqrt(2)
            fired = v > level + k * max(noise, floor[0] * abs(level), floor[1])
        flags.append((step, fired))
        before.append(v)
    # consecutive rows that fire are one alarm (rows, the finite ones being the steps here)
    out, last = [], None
    for step, fired in flags:
        if fired and (last is None or step != last + 1):
            out.append(step)
        last = step if fired else None
    return out


def slow_steps(times: list[float]) -> list[int]:
    """docs/report.md: the step took more than 1.5 x the median of its 50 earlier timed
    steps (20 at least; step 1 and times not above 0 are none), 3 steps in a row."""
    warm = DEFAULT.warmup(ROWS)
    flags, before = [], []
    for step, took in enumerate(times, 1):
        if step == 1 or not 0 < took < math.inf:
            continue
        window = before[-DEFAULT.window :]
        slow = (
            step > warm
            and len(window) >= DEFAULT.min_history
            and took > DEFAULT.slow_factor * median(window)
        )
        flags.append((step, slow))
        before.append(took)
    return streak_starts(flags, DEFAULT.consecutive)


@pytest.mark.parametrize("seed", range(6))
def test_the_history_alarms_fire_where_their_rules_say(tmp_path, seed):
    folder = write_log(tmp_path / "run", seed)
    found = judge(read_run(folder))
    fired = {kind: [a.step for a in found if a.kind == kind] for kind in
             ("loss_spike", "grad_norm_spike", "slow_steps")}  # fmt: skip
    expected = {
        "loss_spike": spike_steps(column(folder, "loss"), DEFAULT.loss_k, DEFAULT.loss_floor),
        "grad_norm_spike": spike_steps(
            column(folder, "grad_norm"), DEFAULT.grad_k, DEFAULT.grad_floor
        ),
        "slow_steps": slow_steps(column(folder, "step_time")),
    }
    assert fired == expected
    assert all(expected.values()), "a log without one of the alarms tests nothing of it"
