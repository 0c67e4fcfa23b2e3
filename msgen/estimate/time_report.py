"""The time section of `msgen estimate` (and of `msgen plan`'s breakdowns): text
lines and the `time` JSON object.

JSON (seconds per step on one device of the stage, unless said otherwise):

    time: {device, step_s, tokens_per_s_per_device, mfu, hfu,
      model_flops_per_step, hardware_flops_per_step (all devices),
      bubble_fraction, layers: [{layer, forward_s, backward_s}] (one copy, one
      micro-batch, recompute in backward), stages: [{stage, compute_s,
      forward_s, backward_s, recompute_s, tp_comm_s, tp_comm_hidden_s,
      pp_comm_s, bubble_s, idle_s, dp_comm_s, dp_comm_hidden_s, optimizer_s,
      total_s}]}

The terms of a stage other than the `*_hidden_s` ones add up to its `total_s`;
`step_s` is the largest `total_s`.
"""

from __future__ import annotations

from msgen.estimate.time import StageTime, StepTime

# The terms of a stage, as the table and the JSON name them.
TERMS = (
    ("compute_s", "compute"),
    ("tp_comm_s", "tp comm"),
    ("pp_comm_s", "pp comm"),
    ("bubble_s", "bubble"),
    ("idle_s", "idle"),
    ("dp_comm_s", "dp comm"),
    ("optimizer_s", "optimizer"),
)
DETAILS = (
    "forward_s",
    "backward_s",
    "recompute_s",
    "tp_comm_hidden_s",
    "dp_comm_hidden_s",
)


def seconds(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"


def time_json(t: StepTime) -> dict:
    return {
        "device": t.device,
        "step_s": t.step_s,
        "tokens_per_s_per_device": t.tokens_per_s_per_device,
        "mfu": t.mfu,
        "hfu": t.hfu,
        "model_flops_per_step": t.flops.model,
        "hardware_flops_per_step": t.flops.hardware,
        "bubble_fraction": t.bubble_fraction,
        "layers": [
            {"layer": k.layer, "forward_s": k.forward_s, "backward_s": k.backward_s}
            for k in t.layers
        ],
        "stages": [stage_json(s) for s in t.stages],
    }


def stage_json(s: StageTime) -> dict:
    out: dict = {"stage": s.stage}
    out.update({key: getattr(s, key) for key, _ in TERMS})
    out.update({key: getattr(s, key) for key in DETAILS})
    out["total_s"] = s.total_s
    return out


def summary(t: StepTime) -> str:
    return (
        f"step {seconds(t.step_s)}, {t.tokens_per_s_per_device:,.0f} tokens/s per device, "
        f"MFU {t.mfu:.1%}, HFU {t.hfu:.1%}"
    )


def render_time(t: StepTime) -> list[str]:
    lines = [
        f"time on {t.device} (the calibrated model; docs/language.md says what it leaves out):",
        f"  {summary(t)}",
        f"  FLOPs per step: model {t.flops.model:.3e}, hardware {t.flops.hardware:.3e} "
        f"(recompute, flash); bubble {t.bubble_fraction:.1%} of the slowest stage",
    ]
    for k in t.layers:
        lines.append(
            f"  {k.layer}, one copy, one micro-batch: forward {seconds(k.forward_s)}, "
            f"backward {seconds(k.backward_s)}"
        )
    heads = ["stage"] + [name for _, name in TERMS] + ["total"]
    rows = [
        [str(s.stage)] + [seconds(getattr(s, key)) for key, _ in TERMS] + [seconds(s.total_s)]
        for s in t.stages
    ]
    widths = [max(len(r[i]) for r in [heads] + rows) for i in range(len(heads))]
    for r in [heads] + rows:
        lines.append("  " + "  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    return lines
