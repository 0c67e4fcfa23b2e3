"""`msgen report --json`: the report as data. Its JSON schema is published as
docs/report.schema.json (tests/test_run_report_parts.py keeps it in step).

Bytes are per device; times in seconds; ratios are measured / predicted.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from msgen.runs.alarms import KINDS, Alarm
from msgen.runs.logs import Run
from msgen.runs.summary import Comparison, Summary, Versus

# The alarms listed of each kind, the first by step: a log that alarms on every other row
# (a million rows, half a million alarms) still gives a report one reads; the rest of a
# kind are counted, with the steps they span.
ALARMS_LISTED = 20


class _Data(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RankReport(_Data):
    rank: int
    first_step: int | None
    last_step: int
    rows: int
    run_json: bool = Field(description="the rank wrote run.json")
    segments: int = Field(description="starts recorded in run.json (a resume adds one)")


class SummaryReport(_Data):
    rank: int = Field(description="the rank the summary reads: the lowest that logs a loss")
    steps: int = Field(description="the last step logged")
    tokens: int | None = Field(description="steps x tokens per step (run.json, else the spec)")
    loss: float | None
    loss_trend_per_100_steps: float | None = Field(
        description="least-squares slope of the loss over the last 50 steps, per 100 steps"
    )
    valid_loss: float | None
    valid_step: int | None
    skipped: int = Field(description="updates skipped (gradients not finite)")
    timed_from: int = Field(description="the first step the times are taken from")
    step_time_s: float | None = Field(description="median")
    step_time_p10_s: float | None
    step_time_p90_s: float | None
    tokens_per_s_per_device: float | None = Field(description="median")
    mfu: float | None = Field(description="median")
    peak_memory_bytes: int | None = Field(description="largest over steps and ranks")


class VersusReport(_Data):
    predicted: float
    measured: float | None
    ratio: float | None = Field(description="measured / predicted")


class StageVersus(VersusReport):
    stage: int


class ComparisonReport(_Data):
    spec: str
    set: list[str] = Field(description="the --set flags the run's tree was compiled with")
    device: str
    devices: int
    run_device: str | None = Field(
        description="MindSpore's device_target the run had (run.json); null: not recorded"
    )
    same_device: bool | None = Field(
        description="the run's device is of the spec's kind (false: the ratios compare "
        "different devices); null: not known"
    )
    step_s: VersusReport | None
    tokens_per_s_per_device: VersusReport | None
    mfu: VersusReport | None
    peak_bytes: list[StageVersus]
    notes: list[str]


class AlarmReport(_Data):
    kind: str = Field(json_schema_extra={"enum": list(KINDS)})
    step: int = Field(description="the first step it shows at")
    rank: int = Field(description="the first rank it shows on")
    ranks: list[int] = Field(description="every rank it shows on at that step")
    message: str


class LeftOffReport(_Data):
    kind: str = Field(json_schema_extra={"enum": list(KINDS)})
    count: int = Field(description="the alarms of this kind past those listed")
    first_step: int = Field(description="the step the first of them shows at")
    last_step: int = Field(description="the step the last of them shows at")

    def line(self) -> str:
        """How the text and HTML reports say it."""
        return f"and {self.count:,} more {self.kind} (steps {self.first_step}-{self.last_step})"


class RunReport(_Data):
    run: str
    world: int
    ranks: list[RankReport]
    notes: list[str] = Field(description="what the run lacks: cut-short rows, missing files")
    provenance: dict | None = Field(description="the reference rank's newest run.json segment")
    summary: SummaryReport
    predicted: ComparisonReport | None
    alarms: list[AlarmReport] = Field(
        description=f"by step: the first {ALARMS_LISTED} of each kind (alarms_left_off counts "
        "the rest)"
    )
    alarms_left_off: list[LeftOffReport] = Field(description="per kind, the alarms not listed")
    alarm_count: int = Field(description="every alarm, listed or left off")
    healthy: bool = Field(description="no alarm (exit status 0; 1 otherwise)")


def versus(v: Versus | None, **extra) -> dict | None:
    return None if v is None else {"predicted": v.predicted, "measured": v.measured,
                                   "ratio": v.ratio, **extra}  # fmt: skip


def comparison_report(c: Comparison) -> ComparisonReport:
    return ComparisonReport(
        spec=c.spec,
        set=list(c.sets),
        device=c.device,
        devices=c.devices,
        run_device=c.run_device,
        same_device=c.same_device,
        step_s=versus(c.step_s),
        tokens_per_s_per_device=versus(c.tokens_per_s_per_device),
        mfu=versus(c.mfu),
        peak_bytes=[versus(v, stage=stage) for stage, v in c.peak_bytes],
        notes=list(c.notes),
    )


def run_report(
    run: Run, summary: Summary, alarms: list[Alarm], comparison: Comparison | None
) -> RunReport:
    ref = run.rank(summary.rank)
    listed, left = bounded(alarms)
    return RunReport(
        run=run.folder.as_posix(),
        world=run.world,
        ranks=[
            RankReport(
                rank=r.rank,
                first_step=r.steps[0] if r.rows else None,
                last_step=r.last_step,
                rows=r.rows,
                run_json=bool(r.segments),
                segments=r.segments,
            )
            for r in run.ranks
        ],
        notes=list(run.notes),
        provenance=ref.provenance,
        summary=SummaryReport(**vars(summary)),
        predicted=comparison_report(comparison) if comparison else None,
        alarms=[
            AlarmReport(
                kind=a.kind, step=a.step, rank=a.rank, ranks=list(a.ranks), message=a.message
            )
            for a in listed
        ],
        alarms_left_off=[
            LeftOffReport(kind=kind, count=n, first_step=first, last_step=last)
            for kind, (n, first, last) in sorted(left.items(), key=lambda x: KINDS.index(x[0]))
        ],
        alarm_count=len(alarms),
        healthy=not alarms,
    )


def bounded(alarms: list[Alarm]) -> tuple[list[Alarm], dict[str, tuple[int, int, int]]]:
    """The first ALARMS_LISTED alarms of each kind (in the given order, by step), and for
    each kind with more: (how many more, the first's step, the last's step)."""
    listed, seen, left = [], dict.fromkeys(KINDS, 0), {}
    for a in alarms:
        seen[a.kind] += 1
        if seen[a.kind] <= ALARMS_LISTED:
            listed.append(a)
            continue
        n, first, _ = left.get(a.kind, (0, a.step, a.step))
        left[a.kind] = (n + 1, first, a.step)
    return listed, left
