"""The device catalogue's fitted values are what the fit gives: the fit is rerun on
specs/validation/published.json's runs marked `fit` (msgen.estimate.calibration,
as bench/calibrate.py runs it) and compared with msgen/ir/devices.py; the runs
marked `check` take no part in it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from msgen.analysis.plan import Plan
from msgen.compiler import analyze
from msgen.estimate.calibration import MEASURES, Run, fit, value, with_value
from msgen.ir.devices import DEVICES

VALIDATION = Path(__file__).resolve().parent.parent / "specs" / "validation"
DOC = json.loads((VALIDATION / "published.json").read_text())


def runs_on(device: str) -> list[Run]:
    out = []
    for entry in DOC["runs"]:
        result = analyze(VALIDATION / entry["spec"], entry["set"])
        if result.spec.cluster.device == device:
            measured = {m: entry[m] for m in MEASURES if m in entry}
            plan = Plan(result.spec, result.facts)
            fitted, kernels = entry["role"] == "fit", frozenset(entry["kernels"])
            out.append(Run.of(entry["source"], plan, measured, fitted, kernels))
    return out


@pytest.fixture(scope="module", params=sorted(DOC["fitted"]))
def device_runs(request):
    return request.param, runs_on(request.param)


def catalogue(name: str) -> dict[str, float]:
    return {p: value(DEVICES[name], p) for p in DOC["fitted"][name]}


@pytest.mark.slow  # the a100 fit: some 3,000 step-time evaluations
def test_every_fitted_value_in_the_catalogue_is_what_the_fit_gives(device_runs):
    name, runs = device_runs
    assert fit(runs, DEVICES[name], DOC["fitted"][name]).values == catalogue(name)


def test_the_fit_owes_nothing_to_the_catalogue_or_the_checks():
    """From other values in the device, and with the checked runs' measurements
    made absurd, the fit lands on the catalogue's values: it starts from fixed
    values, and checks are not fitted on."""
    name = "ascend910b"  # the fast one: the rule is the same for every device
    runs = runs_on(name)
    start = DEVICES[name]
    for p in DOC["fitted"][name]:
        start = with_value(start, p, 0.9)
    spoiled = [
        r if r.fitted else dataclasses.replace(r, measured={m: 1e3 for m in r.measured})
        for r in runs
    ]
    result = fit(spoiled, start, DOC["fitted"][name])
    assert result.values == catalogue(name)
    assert {r.source for r in result.checks} == {r.source for r in runs if not r.fitted}
    assert all(r.fitted for r in result.fit_residuals)
    assert all(r.error < -0.9 for r in result.checks)  # they are residuals, not fitted


def test_every_device_has_runs_held_out_as_checks(device_runs):
    name, runs = device_runs
    assert any(r.fitted for r in runs) and any(not r.fitted for r in runs), name


def test_a_wrong_parameter_or_nothing_to_fit_is_a_clear_error():
    runs = runs_on("ascend910b")
    with pytest.raises(ValueError, match="cannot fit 'kernel_overhead'"):
        fit(runs, DEVICES["ascend910b"], ["kernel_overhead"])
    with pytest.raises(ValueError, match="no run to fit on"):
        fit([r for r in runs if not r.fitted], DEVICES["ascend910b"], ["matmul_efficiency"])
