"""The time section of `msgen estimate` (and of `msgen plan`'s breakdowns) as text
lines; its JSON is msgen.estimate.output's `TimeReport`."""

from __future__ import annotations

from msgen.estimate.time import StepTime

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


def seconds(x: float) -> str:
    return f"{x * 1e3:.1f} ms" if x < 1 else f"{x:.2f} s"


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
