"""The time section of `msgen estimate` (and of `msgen plan`'s breakdowns) as text
lines; its JSON is msgen.estimate.output's `TimeReport`. Also what the step time of
a mixture of experts has been checked against, and whether a spec lies within it."""

from __future__ import annotations

from dataclasses import dataclass

from msgen.estimate.time import StepTime
from msgen.ir.models import Spec


@dataclass(frozen=True)
class MoeCheck:
    """A published MoE training run the step-time model was checked against, not fitted
    on, and what of the MoE path it exercised."""

    source: str  # the run's `source` in specs/validation/published.json
    spec: str  # its spec there
    short: str  # the run in a few words, for the text report
    error: float  # predicted / measured step - 1, with the device catalogue's values
    device: str
    dispatch: str  # "capacity" (GShard's einsum dispatch) or "dropless"
    ep_across_servers: bool  # whether its all-to-alls crossed servers


# The MoE runs of specs/validation/published.json: the one home of what the MoE step
# time has been checked against (tests/test_moe_validation.py holds this tuple to that
# file, and each error to what the model predicts now). Every other run there is dense.
MOE_CHECKS = (
    MoeCheck(
        source="ModelLink (now MindSpeed-LLM) examples/mixtral README, Mixtral-8x7B, "
        "capacity 1.1, ep 2 on 16 Ascend NPUs (910B assumed): 1,053.6 tokens/s per NPU",
        spec="mixtral_8x7b_mindspeed.msl",
        short="Mixtral-8x7B, capacity 1.1, ep 2 inside a server, pp 8, 16 x ascend910b "
        "(ModelLink, now MindSpeed-LLM)",
        error=-0.045,
        device="ascend910b",
        dispatch="capacity",
        ep_across_servers=False,
    ),
)


@dataclass(frozen=True)
class MoeValidation:
    """Whether a spec's MoE step time lies within what MOE_CHECKS exercised: its
    dispatch, its device, and where its ep all-to-alls run. `unchecked` names what it
    has that no check had (empty: validated)."""

    unchecked: tuple[str, ...]
    checks: tuple[MoeCheck, ...] = MOE_CHECKS

    @property
    def validated(self) -> bool:
        return not self.unchecked


DROPLESS = " (the permuting dispatcher, grouped matmuls, imbalance)"


def moe_validation(spec: Spec, ep: int, tp: int) -> MoeValidation | None:
    """None without moe ops. `ep` and `tp` are the layout's (a plan's may differ from
    the spec's). An ep group stays inside a server when ep x tp devices fit one."""
    graphs = (spec.network, *spec.layers.values())
    moes = [op for g in graphs for op in g.ops if op.kind == "moe"]
    if not moes:
        return None
    dispatches = {"dropless" if op.args.get("capacity") is None else "capacity" for op in moes}
    unchecked = [
        f"{d} dispatch" + (DROPLESS if d == "dropless" else "")
        for d in sorted(dispatches - {c.dispatch for c in MOE_CHECKS})
    ]
    if spec.cluster.device not in {c.device for c in MOE_CHECKS}:
        unchecked.append(f"a mixture of experts on {spec.cluster.device}")
    across = ep > 1 and ep * tp > spec.cluster.per_node
    if across and not any(c.ep_across_servers for c in MOE_CHECKS):
        unchecked.append("ep all-to-alls across servers")
    return MoeValidation(tuple(unchecked))


def moe_lines(unchecked: tuple[str, ...], which: str = "") -> list[str]:
    """The text report's lines on the MoE step time (`which`: of what, when not all):
    the verdict, then each checked run and its error."""
    if not unchecked:
        head = ["MoE step time: checked, not fitted, against published runs of this kind:"]
    else:
        head = [
            f"MoE step time NOT VALIDATED{which}: no published run checks "
            f"{', '.join(unchecked)}.",
            "The MoE runs it was checked against:",
        ]
    return [*head, *(f"  {c.short}: {c.error:+.1%}" for c in MOE_CHECKS)]


def moe_verdict(v: MoeValidation | None) -> str:
    """The label in a few words, after a one-line summary (the SVG's)."""
    if v is None:
        return ""
    return "; MoE step time checked" if v.validated else "; MoE step time NOT VALIDATED"


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


def render_time(t: StepTime, moe: MoeValidation | None = None) -> list[str]:
    lines = [
        f"time on {t.device} (the calibrated model; docs/language.md says what it leaves out):",
        f"  {summary(t)}",
        *(f"  {line}" for line in (moe_lines(moe.unchecked) if moe else ())),
        f"  FLOPs per step: model {t.flops.model:.3e}, hardware {t.flops.hardware:.3e} "
        f"(recompute, flash); bubble {t.bubble_fraction:.1%} of the slowest stage",
    ]
    if t.kernels:
        lines.append(f"  kernels: {', '.join(f'{k} {path}' for k, path in t.kernels)}")
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
