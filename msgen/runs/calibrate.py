"""`msgen calibrate RUN_DIR... [--spec SPEC] [--fit P,...] [-o FILE]`: fit the time
model's device parameters to the step times of a user's own runs, with the fit the
device catalogue is calibrated with (msgen.estimate.calibration.fit), and write the
fitted values to a calibration file that `estimate`, `plan` and `report` take with
`--calibration FILE`. The built-in catalogue never changes.

Each run's measured step time is `msgen report`'s: the median over its timed steps.
A fit needs at least as many runs as parameters; by default it fits the matmul and
memory efficiencies, and the efficiency of each network tier some run communicates
over (inside a node when a run has more than one device, between nodes when it
spans several).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from msgen.base.readers import Dict, Num, Obj, Str, load_json
from msgen.diagnostics import printable
from msgen.runs import RunError
from msgen.runs.logs import Run
from msgen.runs.summary import summarize

FORMAT = "msgen-calibration 1"
MIN_STEP_S = 1e-6  # a measured step shorter than this is no training step
CALIBRATION_LIMIT = 2**20  # bytes: a few values and a line per run
# The calibration file (calibration_json writes it): what --calibration reads is checked;
# "runs" is the record of the fit, for people.
CALIBRATION = Obj(
    required={"format": Str(64), "device": Str(64), "values": Dict(Num(), max_len=64)}
)


@dataclass(frozen=True)
class Measured:
    """A run folder, the analysed spec it ran (msgen.compiler.Result), its step time."""

    folder: Path
    result: object
    step_s: float


def measured(run: Run, result) -> Measured:
    """The run's step time, fitted to the analysed spec `result`."""
    folder = run.folder
    step = summarize(run).step_time_s
    if step is None or not math.isfinite(step) or step <= 0:
        raise RunError(f"{printable(str(folder))}: no step time in its logs to fit to")
    if step < MIN_STEP_S:
        raise RunError(
            f"{printable(str(folder))}: a median step time of {step:.3g} s is no training "
            f"step's (at least {MIN_STEP_S:g} s): not fitted to"
        )
    return Measured(folder, result, step)


def default_parameters(plans) -> tuple[str, ...]:
    params = ["matmul_efficiency", "memory_efficiency"]
    if any(p.spec.mesh.devices > 1 for p in plans):
        params.append("intra.efficiency")
    if any(p.spec.mesh.devices > p.spec.cluster.per_node for p in plans):
        params.append("inter.efficiency")
    return tuple(params)


def calibrate(runs: list[Measured], parameters: tuple[str, ...] | None = None):
    """The fit (msgen.estimate.calibration.Fit) of the runs' device to their step times.
    RunError when the runs are of several devices, or fewer than the parameters."""
    from msgen.analysis.plan import Plan
    from msgen.estimate import calibration
    from msgen.ir.devices import DEVICES

    plans = [Plan(m.result.spec, m.result.facts) for m in runs]
    devices = sorted({p.spec.cluster.device for p in plans})
    if len(devices) != 1 or devices[0] not in DEVICES:
        raise RunError(f"the runs must share one catalogue device, not {', '.join(devices)}")
    params = parameters or default_parameters(plans)
    unknown = [p for p in params if p not in calibration.PARAMETERS]
    if unknown:
        raise RunError(
            f"--fit {printable(unknown[0])}: fittable: {', '.join(calibration.PARAMETERS)}"
        )
    if len(runs) < len(params):
        raise RunError(
            f"{len(runs)} run{'s' if len(runs) > 1 else ''} cannot fit {len(params)} "
            f"parameters ({', '.join(params)}): give at least {len(params)} runs of "
            f"different layouts, or fewer parameters with --fit"
        )
    fitted = [
        calibration.Run.of(str(m.folder), p, {"step": m.step_s}, fitted=True)
        for m, p in zip(runs, plans)
    ]
    return calibration.fit(fitted, DEVICES[devices[0]], params)


def calibration_json(fit, runs: list[Measured]) -> str:
    """The calibration file: finite numbers only (JSON has no infinity)."""
    doc = {
        "format": FORMAT,
        "device": fit.device.name,
        "values": fit.values,
        "runs": [
            {"run": m.folder.as_posix(), "spec": m.result.file, "measured_step_s": r.measured,
             "predicted_step_s": r.predicted, "error": r.error}
            for m, r in zip(runs, fit.residuals)
        ],  # fmt: skip
    }
    for m, r in zip(runs, fit.residuals):
        if not all(map(math.isfinite, (r.measured, r.predicted, r.error))):
            raise RunError(
                f"{printable(str(m.folder))}: the model's step time against the measured one "
                "is not a finite number: no calibration file written"
            )
    return json.dumps(doc, indent=2, allow_nan=False) + "\n"


def render(fit, runs: list[Measured]) -> str:
    lines = [f"{fit.device.name}: " + ", ".join(f"{k} = {v:g}" for k, v in fit.values.items())]
    for m, r in zip(runs, fit.residuals):
        lines.append(
            f"  {printable(m.folder.as_posix())} ({printable(m.result.file)}): "
            f"measured {r.measured:.4g} s, "
            f"predicted {r.predicted:.4g} s, residual {r.error:+.1%}"
        )
    return "\n".join(lines) + "\n"


def read_calibration(path: Path) -> dict:
    """A calibration file's device and values; BadInput (naming the file and the key)
    or RunError when it is not one."""
    doc = load_json(path, CALIBRATION_LIMIT, CALIBRATION)
    if doc["format"] != FORMAT:
        raise RunError(
            f"{printable(str(path))} is not a calibration file (msgen calibrate writes them)"
        )
    return {"device": doc["device"], "values": doc["values"]}


def calibrated_device(path: Path, device_name: str):
    """The catalogue's `device_name` with the values of the calibration file at `path`."""
    from msgen.estimate.calibration import PARAMETERS, with_value
    from msgen.ir.devices import DEVICES

    doc = read_calibration(path)
    where = printable(str(path))
    if doc["device"] != device_name:
        raise RunError(
            f"{where} calibrates {printable(doc['device'])}, the spec's device is {device_name}"
        )
    device = DEVICES[device_name]
    for name, value in doc["values"].items():
        if name not in PARAMETERS or not 0 < value <= 1:
            raise RunError(f"{where}: values.{printable(name)} = {value:g} is not a fittable share")
        device = with_value(device, name, value)
    return device
