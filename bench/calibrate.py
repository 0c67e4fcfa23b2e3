"""Fit the step-time model's device parameters to the published runs and print,
for every run, how far the model lands with the catalogue's values and with the
fitted ones, each line labelled `fit` (a residual of the fit) or `check` (a run
the fit did not see).

    python bench/calibrate.py

The runs, their roles and the parameters fitted per device are
specs/validation/published.json; the fit is msgen.estimate.calibration.fit.
tests/test_estimate_calibration.py reruns it and fails when the catalogue
(msgen/ir/devices.py) holds other values than it prints.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from msgen.analysis.plan import Plan  # noqa: E402
from msgen.compiler import analyze  # noqa: E402
from msgen.estimate.calibration import Run, fit, residuals  # noqa: E402
from msgen.ir.devices import DEVICES  # noqa: E402

VALIDATION = REPO / "specs" / "validation"
MEASURES = ("layer_forward", "layer_backward", "step")


def published() -> tuple[dict[str, list[str]], dict[str, list[Run]]]:
    """The parameters fitted per device, and the published runs per device."""
    doc = json.loads((VALIDATION / "published.json").read_text())
    by_device: dict[str, list[Run]] = {}
    for entry in doc["runs"]:
        result = analyze(VALIDATION / entry["spec"], entry["set"])
        plan = Plan(result.spec, result.facts)
        measured = {m: entry[m] for m in MEASURES if m in entry}
        run = Run.of(
            entry["source"],
            plan,
            measured,
            fitted=entry["role"] == "fit",
            kernels=frozenset(entry["kernels"]),
        )
        by_device.setdefault(plan.spec.cluster.device, []).append(run)
    return doc["fitted"], by_device


def report(rows, title: str) -> None:
    print(f"  {title}")
    for r in rows:
        label = "fit" if r.fitted else "check"
        print(f"    {label:<5} {r.source[:66]:<66} {r.measure:<14} {r.predicted:>9.4f} vs "
              f"{r.measured:>8.4f} {r.error:+.1%}")  # fmt: skip


def main() -> int:
    fitted, by_device = published()
    for name, runs in by_device.items():
        device = DEVICES[name]
        print(f"{name}: fitting {', '.join(fitted[name])} on the runs marked fit")
        report(residuals(runs, device), "the catalogue's values")
        result = fit(runs, device, fitted[name])
        print("  fitted: " + ", ".join(f"{n} = {v}" for n, v in result.values.items()))
        report(result.residuals, "fitted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
