"""MindSpore's dry run held against the estimate, stage by stage.

Under `msrun --sim_level 1` each worker compiles the real parallel graph and, with
GLOG_v=1, logs its memory statistics (MindSpore 2.10,
plugin/ascend/res_manager/mem_manager/ascend_dynamic_mem_adapter.cc, DevMemStatistics;
the strings are in lib/plugin/ascend/libmindspore_ascend_res_manager.so, and the
format in MindSpore's DryRun tutorial):

    Used peak memory usage (without fragments): 23716M
    Actual peak memory usage (with fragments): 26244M

M is MiB (the tutorial's 65536M device is 64 GB). A worker's log is
`LOGDIR/worker_<rank>.log`; its stage is RankMesh.stage_of(rank) (stage outermost).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from msgen.doctor.result import Check, error, ok, warning
from msgen.ir.mesh import RankMesh

MiB = 2**20
USED = re.compile(r"Used peak memory usage \(without fragments\):\s*(\d+)\s*M")
ACTUAL = re.compile(r"Actual peak memory usage \(with fragments\):\s*(\d+)\s*M")
WORKER_LOG = re.compile(r"^worker_(\d+)\.log$")


@dataclass(frozen=True)
class Peak:
    used_bytes: int  # without fragments
    actual_bytes: int  # with fragments


def parse_log(text: str) -> Peak | None:
    """The highest peaks a worker's log reports (it may report once per graph)."""
    used = [int(m) for m in USED.findall(text)]
    actual = [int(m) for m in ACTUAL.findall(text)]
    if not used and not actual:
        return None
    return Peak(max(used, default=0) * MiB, max(actual, default=0) * MiB)


@dataclass(frozen=True)
class StageRow:
    stage: int
    rank: int | None  # the rank whose log gave the stage's peak
    peak: Peak | None
    estimate_bytes: int
    budget_bytes: int | None

    @property
    def ratio(self) -> float | None:
        return (
            self.peak.actual_bytes / self.estimate_bytes
            if self.peak and self.estimate_bytes
            else None
        )

    def as_json(self) -> dict:
        return {
            "stage": self.stage,
            "rank": self.rank,
            "used_bytes": self.peak.used_bytes if self.peak else None,
            "actual_bytes": self.peak.actual_bytes if self.peak else None,
            "estimate_bytes": self.estimate_bytes,
            "ratio": round(self.ratio, 4) if self.ratio is not None else None,
            "budget_bytes": self.budget_bytes,
        }


def read_logs(logdir: Path) -> dict[int, Peak | None]:
    """Each worker log's peaks by rank (None: a log without the lines)."""
    found = {}
    for path in sorted(logdir.iterdir()) if logdir.is_dir() else ():
        m = WORKER_LOG.match(path.name)
        if m and path.is_file():
            found[int(m.group(1))] = parse_log(path.read_text(encoding="utf-8", errors="replace"))
    return found


def stage_rows(
    logs: dict[int, Peak | None], estimates: list[int], budget: int | None, mesh: RankMesh
) -> list[StageRow]:
    """Per stage: the highest actual peak among its ranks' logs, beside its estimate."""
    rows = []
    for stage, estimate_bytes in enumerate(estimates):
        mine = [
            (peak.actual_bytes, rank, peak)
            for rank, peak in logs.items()
            if peak is not None and mesh.stage_of(rank) == stage
        ]
        _, rank, peak = max(mine, key=lambda t: (t[0], -t[1])) if mine else (0, None, None)
        rows.append(StageRow(stage, rank, peak, estimate_bytes, budget))
    return rows


def dryrun_checks(
    logdir: Path, logs: dict[int, Peak | None], rows: list[StageRow], mesh: RankMesh
) -> list[Check]:
    if not logs:
        return [error("dryrun", f"no worker_<rank>.log in {logdir}",
                      "run launch/dryrun.sh LOGDIR on a host with the CANN toolkit first")]  # fmt: skip
    found = []
    for rank, peak in sorted(logs.items()):
        if peak is None:
            found.append(error("dryrun", f"worker_{rank}.log has no peak memory lines",
                               "the dry run stopped before compiling (see the log), or ran without "
                               "GLOG_v=1; launch/dryrun.sh sets it"))  # fmt: skip
    for row in rows:
        if row.peak is None:
            first = mesh.rank(stage=row.stage)
            found.append(error("dryrun", f"stage {row.stage}: no log with peaks (rank {first} is its first rank)",
                               f"run launch/dryrun.sh; it runs rank {first} for stage {row.stage}"))  # fmt: skip
        elif row.budget_bytes is not None and row.peak.actual_bytes > row.budget_bytes:
            found.append(error("dryrun", f"stage {row.stage} (rank {row.rank}): the dry run peaks at "
                               f"{row.peak.actual_bytes / 2**30:.2f} GiB, over the {row.budget_bytes / 2**30:.2f} GiB budget",
                               "lower the stage's memory (recompute, zero, more pp or tp) and run the dry run again"))  # fmt: skip
        elif row.ratio is not None and row.ratio > 1.1:
            found.append(warning("dryrun", f"stage {row.stage}: the dry run peaks {row.ratio:.2f}x the estimate",
                                 "the estimate is low for this layout; keep more headroom"))  # fmt: skip
    return found or [
        ok("dryrun", f"every stage's dry-run peak within the budget ({len(rows)} stages)")
    ]


def render_rows(rows: list[StageRow]) -> str:
    def g(n: int | None) -> str:
        return "-" if n is None else f"{n / 2**30:.2f}"

    lines = ["stage  rank  used GiB  actual GiB  estimate GiB  actual/estimate  budget GiB"]
    for r in rows:
        ratio = "-" if r.ratio is None else f"{r.ratio:.2f}"
        lines.append(
            f"{r.stage:>5}  {'-' if r.rank is None else r.rank:>4}  "
            f"{g(r.peak.used_bytes if r.peak else None):>8}  {g(r.peak.actual_bytes if r.peak else None):>10}  "
            f"{g(r.estimate_bytes):>12}  {ratio:>15}  {g(r.budget_bytes):>10}"
        )
    return "\n".join(lines) + "\n"
