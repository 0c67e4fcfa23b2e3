"""Fit the step-time model's device parameters to measured runs: the one fitting
routine, used by bench/calibrate.py on the published runs (and by anything that
calibrates on a user's own runs).

Pure functions. A `Run` is a plan with what was measured on it and whether that
measurement is fitted on or held out as a check; `fit` returns the fitted values,
the device carrying them, and a residual for every measurement of every run, each
labelled `fitted` (a fit residual: small by construction, it says how well the
parameters *can* match) or not (a check: the model's error on a run it never saw).

The fit minimises the mean squared relative error of the fitted measurements by
coordinate search over a grid of shares (0.005 to 0.995 in steps of 0.005, never
all of a peak), passes over the parameters in the order given until one moves
nothing. Grid and
order make it deterministic: the same runs give the same values, so a test can
rerun it and compare with the device catalogue.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from msgen.analysis.plan import Plan
from msgen.estimate.memory import Estimate, estimate
from msgen.estimate.time import step_time
from msgen.ir.devices import Calibration, Device

# What a run can have measured, in seconds: per layer copy and micro-batch
# (forward, backward), per step.
MEASURES = ("layer_forward", "layer_backward", "step")
# The parameters a fit may move: the calibration's shares and the links' efficiencies.
LINK_PARAMETERS = ("intra.efficiency", "inter.efficiency")
PARAMETERS = (
    "matmul_efficiency",
    "memory_efficiency",
    "tp_overlap",
    "dp_overlap",
    *LINK_PARAMETERS,
)
GRID = tuple(round(0.005 * i, 3) for i in range(1, 200))
START = 0.5  # every fitted parameter, whatever the device held: the fit depends on the runs only
PASSES = 100  # at most; a pass that moves nothing ends the search


@dataclass(frozen=True)
class Run:
    """One measured run: its plan, its memory estimate (the time model's input,
    computed once), measure -> seconds, whether the fit uses it, and the kernels it
    ran fused (msgen/estimate/kernels.py; None: those the generated code runs)."""

    source: str
    plan: Plan
    memory: Estimate
    measured: Mapping[str, float]
    fitted: bool
    kernels: frozenset[str] | None = None

    @classmethod
    def of(
        cls,
        source: str,
        plan: Plan,
        measured: Mapping[str, float],
        fitted: bool,
        kernels: frozenset[str] | None = None,
    ) -> Run:
        unknown = set(measured) - set(MEASURES)
        if unknown:
            raise ValueError(
                f"unknown measure {sorted(unknown)[0]!r}; known: {', '.join(MEASURES)}"
            )
        # a relative error divides by the measurement: it must be a positive number
        bad = [m for m, s in measured.items() if not (math.isfinite(s) and s > 0)]
        if bad:
            raise ValueError(f"{source}: {bad[0]} = {measured[bad[0]]} is not a positive time")
        return cls(source, plan, estimate(plan), dict(measured), fitted, kernels)


@dataclass(frozen=True)
class Residual:
    """The model against one measurement: relative error = predicted / measured - 1."""

    source: str
    measure: str
    predicted: float
    measured: float
    fitted: bool  # True: a fit residual; False: a check on a run the fit did not see

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1


@dataclass(frozen=True)
class Fit:
    """The fitted parameters, the device with them, and every run's residuals."""

    values: dict[str, float]
    device: Device
    residuals: tuple[Residual, ...]

    @property
    def checks(self) -> tuple[Residual, ...]:
        return tuple(r for r in self.residuals if not r.fitted)

    @property
    def fit_residuals(self) -> tuple[Residual, ...]:
        return tuple(r for r in self.residuals if r.fitted)


def predicted(run: Run, device: Device) -> dict[str, float]:
    """What the time model says of each measure the run has, on `device`."""
    t = step_time(run.plan, run.memory, device, run.kernels)
    if t is None:
        raise ValueError(f"{run.source}: the time model has no step time for this plan")
    every = {"step": t.step_s}
    if len(t.layers) == 1:
        (layer,) = t.layers
        every |= {"layer_forward": layer.forward_s, "layer_backward": layer.backward_s}
    missing = run.measured.keys() - every.keys()
    if missing:
        raise ValueError(f"{run.source}: a per-layer time needs a plan with one repeated layer")
    return {m: every[m] for m in run.measured}


def value(device: Device, name: str) -> float:
    """The current value of a fittable parameter of `device`."""
    if name in LINK_PARAMETERS:
        tier, _, field = name.partition(".")
        return getattr(getattr(device, tier), field)
    return getattr(device.calibration, name)


def with_value(device: Device, name: str, v: float) -> Device:
    """`device` with the parameter `name` set to `v`."""
    if name in LINK_PARAMETERS:
        tier, _, field = name.partition(".")
        link = dataclasses.replace(getattr(device, tier), **{field: v})
        return dataclasses.replace(device, **{tier: link})
    calibration: Calibration = dataclasses.replace(device.calibration, **{name: v})
    return dataclasses.replace(device, calibration=calibration)


def residuals(runs: Sequence[Run], device: Device) -> tuple[Residual, ...]:
    """Every measurement of every run against the model on `device`, in run order."""
    out = []
    for run in runs:
        got = predicted(run, device)
        out += [
            Residual(run.source, m, got[m], run.measured[m], run.fitted)
            for m in MEASURES
            if m in run.measured
        ]
    return tuple(out)


def loss(runs: Sequence[Run], device: Device) -> float:
    """Mean squared relative error over the fitted runs' measurements."""
    errors = [r.error for r in residuals([r for r in runs if r.fitted], device)]
    return sum(e * e for e in errors) / len(errors)


def moved(runs: Sequence[Run], device: Device, name: str, v: float) -> float:
    """The loss with one parameter moved to v."""
    return loss(runs, with_value(device, name, v))


def line_search(f) -> float:
    """The grid value minimising f, by ternary search: along one parameter every
    prediction moves one way (a larger share is never slower), so the loss falls
    then rises. Ties go to the smaller value, so the result is the same each run."""
    lo, hi = 0, len(GRID) - 1
    while hi - lo > 2:
        a, b = lo + (hi - lo) // 3, hi - (hi - lo) // 3
        if f(GRID[a]) <= f(GRID[b]):
            hi = b
        else:
            lo = a
    return min(GRID[lo : hi + 1], key=f)


def fit(runs: Sequence[Run], device: Device, parameters: Sequence[str]) -> Fit:
    """Fit `parameters` of `device` to the runs marked `fitted`; residuals of all.

    Raises ValueError for an unknown parameter, or when no run is fitted on."""
    unknown = [p for p in parameters if p not in PARAMETERS]
    if unknown:
        raise ValueError(f"cannot fit {unknown[0]!r}; fittable: {', '.join(PARAMETERS)}")
    if not any(r.fitted for r in runs):
        raise ValueError("no run to fit on")
    for p in parameters:
        device = with_value(device, p, START)
    for _ in range(PASSES):
        before = device
        for p in parameters:
            device = with_value(device, p, line_search(partial(moved, runs, device, p)))
        if device == before:
            break
    return Fit({p: value(device, p) for p in parameters}, device, residuals(runs, device))
