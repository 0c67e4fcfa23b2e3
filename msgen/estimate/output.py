"""The estimate as data: what `msgen estimate --json` prints (and plan.json's
`estimate`, without `time`), as pydantic models. The JSON schema is published as
docs/estimate.schema.json (tests/test_estimate_cli.py keeps it in step).

Bytes are per device, GiB = 2^30; time is seconds per step on one device of the
stage unless said otherwise.
"""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from msgen.estimate.memory import Estimate, StageMemory

if TYPE_CHECKING:  # compile writes the memory estimate only: it never loads the time model
    from msgen.estimate.time import StepTime
    from msgen.estimate.time_report import MoeValidation


class _Data(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Mesh(_Data):
    dp: int
    tp: int
    pp: int
    ep: int = Field(1, description="expert parallel, carved out of dp (adds no devices)")


class Dtypes(_Data):
    weights: str
    master: str | None
    grads: str
    optimizer: str = "fp32"


class BytesPerParam(_Data):
    weights: int
    master: int
    grads: int
    optimizer: int
    total: int


class LayerKind(_Data):
    layer: str
    copies: int
    recompute: str
    activation_bytes_per_layer: int
    recompute_working_bytes: int = Field(
        description="what backward re-makes of one copy's saved tensors for one "
        "micro-batch beyond what the copy keeps, at its largest (0 without recompute)"
    )


class StageReport(_Data):
    stage: int
    layers: int
    layer_kinds: list[LayerKind]
    params: int = Field(description="per device: the model-parallel slices, before ZeRO")
    weights_bytes: int
    grads_bytes: int
    accumulation_bytes: int
    optimizer_bytes: int
    activation_bytes_per_layer: int = Field(
        description="the stage's per-micro-batch layer activations over its layers: exact "
        "with one layer kind on the stage (layer_kinds has each kind's exact figure), "
        "rounded up when kinds differ"
    )
    in_flight_micro_batches: int | float = Field(
        description="a whole number except under interleaving (p + (p - 1)/m on the first stage)"
    )
    activations_bytes: int = Field(
        description="per layer x layers x in flight, rounded up to a byte"
    )
    other_activations_bytes: int
    logits_bytes: int
    recompute_working_bytes: int = Field(
        description="the recomputed layer's working memory, once per stage (one layer, one "
        "micro-batch at a time): the largest layer_kinds recompute_working_bytes, less what "
        "the network's ops after the layers saved for that micro-batch (freed before any "
        "layer's backward), at least 0"
    )
    hccl_bytes: int
    total_bytes: int
    headroom_bytes: int
    fits: bool


class LayerTimeReport(_Data):
    """One copy, one micro-batch, recompute in backward."""

    layer: str
    forward_s: float
    backward_s: float


class StageTimeReport(_Data):
    """The terms other than the `*_hidden_s` ones add up to `total_s`."""

    stage: int
    compute_s: float
    tp_comm_s: float
    pp_comm_s: float
    bubble_s: float
    idle_s: float
    dp_comm_s: float
    optimizer_s: float
    forward_s: float
    backward_s: float
    recompute_s: float
    tp_comm_hidden_s: float
    dp_comm_hidden_s: float
    total_s: float


class MoeCheckReport(_Data):
    """A published MoE run the step-time model was checked against (not fitted on)."""

    source: str = Field(description="as specs/validation/published.json names the run")
    spec: str = Field(description="its spec in specs/validation")
    device: str
    dispatch: str = Field(description='"capacity" or "dropless"')
    ep_across_servers: bool
    error: float = Field(description="predicted / measured step time - 1")


class MoeValidationReport(_Data):
    """Whether the published MoE runs the model was checked against cover this spec."""

    validated: bool = Field(
        description="true when every part of this spec's MoE step time (dispatch, device, "
        "where the ep all-to-alls run) was exercised by a checked run"
    )
    reason: str | None = Field(description="what no checked run has, when not validated")
    checked_against: list[MoeCheckReport]


class TimeReport(_Data):
    """The step-time model; `step_s` is the largest stage `total_s`."""

    device: str
    step_s: float
    tokens_per_s_per_device: float
    mfu: float
    hfu: float
    model_flops_per_step: int = Field(description="all devices")
    hardware_flops_per_step: int = Field(description="all devices")
    bubble_fraction: float
    layers: list[LayerTimeReport]
    stages: list[StageTimeReport]
    moe_validation: MoeValidationReport | None = Field(
        None, description="with moe ops only: what the MoE step time was checked against"
    )


class EstimateReport(_Data):
    model: str
    device: str | None
    devices: int
    mesh: Mesh
    schedule: str
    chunks: int
    micro_batches: int
    zero: int
    dtypes: Dtypes
    bytes_per_param: BytesPerParam
    params_total: int = Field(description="logical, each parameter once")
    params_active: int = Field(
        description="the parameters one token's forward reads: all but the experts a "
        "mixture of experts does not route it to (equal to params_total without moe)"
    )
    params_mtp: int = Field(
        description="the multi-token prediction modules' own parameters (train.mtp), inside "
        "params_total: their norms, eh_proj and block; the embedding table and output "
        "layer they share are the main model's (0 without mtp)"
    )
    budget_bytes: int | None
    budget_source: str | None = Field(description='"budget.device_memory" or "device"')
    hbm_bytes: int | None = Field(description="of the device")
    runtime_reserve_bytes: int | None = Field(description="of the device")
    fits: bool
    stages: list[StageReport]
    time: TimeReport | None = None


def number(x: Fraction) -> int | float:
    return int(x) if x.denominator == 1 else float(x)


def fields_of(model: type[BaseModel], source: object, **given) -> dict:
    """The model's fields read from `source`'s attributes of the same names, but for
    those `given`."""
    return {k: getattr(source, k) for k in model.model_fields if k not in given} | given


def stage_report(s: StageMemory) -> StageReport:
    return StageReport(
        **fields_of(
            StageReport,
            s,
            layer_kinds=[LayerKind(**fields_of(LayerKind, k)) for k in s.layer_kinds],
            in_flight_micro_batches=number(s.in_flight_micro_batches),
        )
    )


def moe_validation_report(v: MoeValidation) -> MoeValidationReport:
    return MoeValidationReport(
        validated=v.validated,
        reason=f"no published run checks {', '.join(v.unchecked)}" if v.unchecked else None,
        checked_against=[MoeCheckReport(**fields_of(MoeCheckReport, c)) for c in v.checks],
    )


def time_report(t: StepTime, moe: MoeValidation | None = None) -> TimeReport:
    return TimeReport(
        device=t.device,
        step_s=t.step_s,
        tokens_per_s_per_device=t.tokens_per_s_per_device,
        mfu=t.mfu,
        hfu=t.hfu,
        model_flops_per_step=t.flops.model,
        hardware_flops_per_step=t.flops.hardware,
        bubble_fraction=t.bubble_fraction,
        layers=[LayerTimeReport(**fields_of(LayerTimeReport, k)) for k in t.layers],
        stages=[StageTimeReport(**fields_of(StageTimeReport, s)) for s in t.stages],
        moe_validation=moe_validation_report(moe) if moe else None,
    )


def estimate_report(
    est: Estimate, timing: StepTime | None = None, moe: MoeValidation | None = None
) -> EstimateReport:
    prec = est.precision
    device = est.device
    return EstimateReport(
        model=est.model,
        device=device.name if device else None,
        devices=est.devices,
        mesh=Mesh(**est.mesh),
        schedule=est.schedule,
        chunks=est.chunks,
        micro_batches=est.micro_batches,
        zero=est.zero,
        dtypes=Dtypes(weights=prec.weight_dtype, master=prec.master_dtype, grads=prec.grad_dtype),
        bytes_per_param=BytesPerParam(
            weights=prec.weight,
            master=prec.master,
            grads=prec.grad,
            optimizer=prec.optimizer,
            total=prec.per_param,
        ),
        params_total=est.params_total,
        params_active=est.params_active,
        params_mtp=est.params_mtp,
        budget_bytes=est.budget_bytes,
        budget_source=est.budget_source,
        hbm_bytes=device.hbm_bytes if device else None,
        runtime_reserve_bytes=device.reserve_bytes if device else None,
        fits=est.fits,
        stages=[stage_report(s) for s in est.stages],
        time=time_report(timing, moe) if timing else None,
    )
