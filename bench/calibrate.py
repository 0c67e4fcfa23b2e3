"""Fit the step-time model's calibrated parameters to published runs, and print
how far the model lands from each run with the catalogue's values and with
the fitted ones.

    python bench/calibrate.py

The runs are specs/validation/published.json. Fitted per device, as few as the
runs pin down: a100_80g: matmul efficiency, memory efficiency and NVLink
efficiency, on Korthikanti et al.'s per-layer times (Table 4) only, so that the
end-to-end times (Table 5) stay a check; ascend910b: matmul efficiency and
tp_overlap on MindSpeed-LLM's two LLaMA2 runs. The fit minimises the mean squared
relative error by coordinate search on a 0.005 grid; copy what it prints into
msgen/ir/devices.py.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from msgen.analysis.plan import Plan  # noqa: E402
from msgen.compiler import analyze  # noqa: E402
from msgen.estimate.memory import estimate  # noqa: E402
from msgen.estimate.time import step_time  # noqa: E402
from msgen.ir.devices import DEVICES, Device  # noqa: E402

VALIDATION = REPO / "specs" / "validation"

# device -> (parameters fitted, which measurements fit them)
FITTED = {
    "a100_80g": (
        ("matmul_efficiency", "memory_efficiency", "intra.efficiency"),
        ("layer_forward", "layer_backward"),
    ),
    "ascend910b": (("matmul_efficiency", "tp_overlap"), ("step",)),
}
MEASURES = ("layer_forward", "layer_backward", "step")


def runs() -> list[dict]:
    return json.loads((VALIDATION / "published.json").read_text())["runs"]


def plans(rows):
    out = []
    for run in rows:
        result = analyze(VALIDATION / run["spec"], run["set"])
        plan = Plan(result.spec, result.facts)
        out.append((run, plan, estimate(plan)))
    return out


def predicted(plan, est, device: Device) -> dict[str, float]:
    t = step_time(plan, est, device)
    (layer,) = t.layers
    return {"layer_forward": layer.forward_s, "layer_backward": layer.backward_s, "step": t.step_s}


def get(device: Device, name: str) -> float:
    if name.startswith("intra."):
        return getattr(device.intra, name.partition(".")[2])
    return getattr(device.calibration, name)


def with_value(device: Device, name: str, value: float) -> Device:
    if name.startswith("intra."):
        intra = dataclasses.replace(device.intra, **{name.partition(".")[2]: value})
        return dataclasses.replace(device, intra=intra)
    return dataclasses.replace(
        device, calibration=dataclasses.replace(device.calibration, **{name: value})
    )


def errors(cases, device: Device, measures) -> list[float]:
    out = []
    for run, plan, est in cases:
        got = predicted(plan, est, device)
        out += [got[m] / run[m] - 1 for m in measures if m in run]
    return out


def loss(cases, device, measures) -> float:
    errs = errors(cases, device, measures)
    return sum(e * e for e in errs) / len(errs)


def fit(cases, device: Device, names, measures) -> Device:
    grid = [round(0.005 * i, 3) for i in range(1, 200)]  # below 1: never all of a peak
    for _ in range(4):
        for name in names:
            device = min(
                (with_value(device, name, v) for v in grid),
                key=lambda d: loss(cases, d, measures),
            )
    return device


def report(cases, device: Device, title: str) -> None:
    print(f"  {title}")
    for run, plan, est in cases:
        got = predicted(plan, est, device)
        for m in MEASURES:
            if m in run:
                err = got[m] / run[m] - 1
                print(f"    {run['source'][:70]:<70} {m:<15} {got[m]:>9.4f} vs {run[m]:>8.4f} "
                      f"{err:+.1%}")  # fmt: skip


def main() -> int:
    by_device: dict[str, list] = {}
    for case in plans(runs()):
        by_device.setdefault(case[1].spec.cluster.device, []).append(case)
    for name, cases in by_device.items():
        device = DEVICES[name]
        names, measures = FITTED[name]
        print(f"{name}: fitting {', '.join(names)} on {', '.join(measures)}")
        report(cases, device, "the catalogue's values")
        fitted = fit(cases, device, names, measures)
        print("  fitted: " + ", ".join(f"{n} = {get(fitted, n)}" for n in names))
        report(cases, fitted, "fitted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
