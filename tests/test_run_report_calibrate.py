"""`msgen calibrate` fits the time model back: four runs of specs/gpt7b.msl in other
layouts and shapes, their logs made from the step-time model with known device
parameters (TRUTH) and 1% noise per step, are fitted back within TOLERANCE of TRUTH;
fewer runs than parameters are refused; and `--calibration FILE` makes `estimate`,
`plan` and `report` time on the fitted device (the catalogue stays as it is)."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from msgen.analysis.plan import Plan
from msgen.cli import main
from msgen.compiler import analyze
from msgen.estimate.memory import estimate
from msgen.estimate.time import step_time
from msgen.ir.devices import DEVICES
from msgen.syntax.edit import write_settings

pytestmark = pytest.mark.slow

GPT7B = Path(__file__).resolve().parents[1] / "specs" / "gpt7b.msl"
TRUTH = {"matmul_efficiency": 0.45, "memory_efficiency": 0.6, "intra.efficiency": 0.5}
# Relative, per parameter: the matmuls set most of a step's time, the others less, so
# the same noise moves their fit more (and the fit's grid is 0.005).
TOLERANCE = {"matmul_efficiency": 0.05, "memory_efficiency": 0.1, "intra.efficiency": 0.15}
NOISE = 0.01  # of each step's time
# Layouts and shapes whose times weigh matmuls, memory-bound kernels and tp
# communication differently (sets on specs/gpt7b.msl, 8 devices, global batch 256).
LAYOUTS = {
    "tp2": ("mesh.dp=4", "mesh.tp=2", "pipeline.micro_batches=64"),
    "tp8": ("mesh.dp=1", "mesh.tp=8", "pipeline.micro_batches=256"),
    "hidden1024": ("mesh.dp=4", "mesh.tp=2", "pipeline.micro_batches=64", "model.hidden=1024",
                   "model.heads=8"),
    "seq8192": ("mesh.dp=1", "mesh.tp=8", "pipeline.micro_batches=256", "model.seq=8192"),
}  # fmt: skip
STEPS = 60


def true_device():
    d = DEVICES["ascend910b"]
    calibration = dataclasses.replace(
        d.calibration,
        matmul_efficiency=TRUTH["matmul_efficiency"],
        memory_efficiency=TRUTH["memory_efficiency"],
    )
    intra = dataclasses.replace(d.intra, efficiency=TRUTH["intra.efficiency"])
    return dataclasses.replace(d, calibration=calibration, intra=intra)


def run(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main([*map(str, argv)])
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[tuple[Path, Path, float]]:
    """(run folder, its spec, the true step time) per layout."""
    root = tmp_path_factory.mktemp("calibrate")
    shutil.copy(GPT7B.parent / "hccn.conf", root)  # the spec reads it
    rng = np.random.default_rng(0)
    out = []
    for name, sets in LAYOUTS.items():
        spec = root / f"gpt7b_{name}.msl"
        spec.write_text(write_settings(GPT7B.read_text(), list(sets), str(spec)))
        result = analyze(spec)
        assert result.ok, [d.message for d in result.diagnostics]
        plan = Plan(result.spec, result.facts)
        truth = step_time(plan, estimate(plan), true_device()).step_s
        folder = root / f"run_{name}"
        (folder / "rank_0").mkdir(parents=True)
        with (folder / "rank_0" / "log.csv").open("w", newline="") as f:
            log = csv.writer(f)
            log.writerow(["step", "loss", "step_time", "tokens_per_s", "mfu"])
            for step in range(1, STEPS + 1):
                took = truth * (5 if step == 1 else 1 + NOISE * rng.standard_normal())
                log.writerow([step, f"{5 - step / 100:.6g}", f"{took:.6g}", "", ""])
        segment = {"rank": 0, "world": 8, "spec": {"path": str(spec)}}
        (folder / "rank_0" / "run.json").write_text(json.dumps({"segments": [segment]}))
        out.append((folder, spec, truth))
    return out


@pytest.fixture(scope="module")
def fitted(runs, tmp_path_factory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("fit") / "calibration.json"
    status, out, err = run("calibrate", *[r[0] for r in runs], "-o", path)
    assert status == 0, err
    return path, out


def test_the_fit_finds_the_parameters_the_logs_were_made_with(fitted):
    values = json.loads(fitted[0].read_text())["values"]
    assert set(values) == set(TRUTH)  # the default: matmul, memory, the in-node link
    for name, truth in TRUTH.items():
        assert values[name] == pytest.approx(truth, rel=TOLERANCE[name]), (name, values)


def test_the_residual_of_each_run_is_printed(fitted, runs):
    doc = json.loads(fitted[0].read_text())
    lines = fitted[1].splitlines()
    assert lines[0].startswith("ascend910b: matmul_efficiency = ")
    for (folder, _, truth), entry, line in zip(runs, doc["runs"], lines[1:]):
        assert entry["run"] == folder.as_posix() and line.startswith(f"  {folder.as_posix()} (")
        # the measured step is the median of the noisy steps, near the truth
        assert entry["measured_step_s"] == pytest.approx(truth, rel=0.02)
        assert entry["error"] == pytest.approx(
            entry["predicted_step_s"] / entry["measured_step_s"] - 1
        )
        assert f"residual {entry['error']:+.1%}" in line and abs(entry["error"]) < 0.02


def test_fewer_runs_than_parameters_are_refused(runs, tmp_path):
    status, out, err = run("calibrate", runs[0][0], runs[1][0], "-o", tmp_path / "c.json")
    assert status == 2 and out == "" and not (tmp_path / "c.json").exists()
    assert "2 runs cannot fit 3 parameters" in err and "--fit" in err
    # one parameter from one run is a fit
    status, out, err = run("calibrate", runs[1][0], "--fit", "matmul_efficiency")
    assert status == 0 and out.startswith("ascend910b: matmul_efficiency = "), err


def test_an_existing_output_is_replaced_only_with_force(fitted, runs):
    path = fitted[0]
    status, _, err = run("calibrate", *[r[0] for r in runs], "-o", path)
    assert status == 2 and "--force" in err


def test_calibration_makes_estimate_plan_and_report_time_on_the_fitted_device(fitted, runs):
    path = fitted[0]
    doc = json.loads(path.read_text())
    folder, spec, _ = runs[1]
    _, out, _ = run("estimate", spec, "--json", "--calibration", path)
    assert json.loads(out)["time"]["step_s"] == pytest.approx(doc["runs"][1]["predicted_step_s"])
    _, plain, _ = run("estimate", spec, "--json")
    assert json.loads(plain)["time"]["step_s"] != json.loads(out)["time"]["step_s"]
    _, out, _ = run("plan", spec, "--json", "--calibration", path)
    assert json.loads(out)["spec"]["step_s"] == pytest.approx(doc["runs"][1]["predicted_step_s"])
    _, out, _ = run("report", folder, "--json", "--spec", spec, "--calibration", path)
    predicted = json.loads(out)["predicted"]["step_s"]
    assert predicted["predicted"] == pytest.approx(doc["runs"][1]["predicted_step_s"])
    assert DEVICES["ascend910b"].calibration.matmul_efficiency == 0.595  # untouched


def test_a_calibration_of_another_device_is_refused(fitted, tmp_path):
    doc = json.loads(fitted[0].read_text()) | {"device": "a100_80g"}
    other = tmp_path / "other.json"
    other.write_text(json.dumps(doc))
    status, _, err = run("estimate", GPT7B, "--calibration", other)
    assert status == 2 and "calibrates a100_80g, the spec's device is ascend910b" in err
