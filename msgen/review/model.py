"""The diff as data: what `msgen diff --format json` prints. Its JSON schema is
published as docs/diff.schema.json (tests/test_diff.py keeps it in step).

A section that could not be compared (a side has errors) is null; a section that
was compared and did not change is an empty list. Bytes are per device; time is
seconds per step, as in `msgen estimate --json`, whose field names the items keep.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Number = int | float
Change = Literal["changed", "added", "removed"]


class _Data(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Message(_Data):
    code: str
    severity: str
    message: str
    line: int | None


class SideReport(_Data):
    label: str = Field(description="the spec as given, or REF:path for --base")
    status: Literal["ok", "over budget", "errors"]
    diagnostics: list[Message]


class SettingChange(_Data):
    setting: str = Field(description="BLOCK.KEY, recompute.LAYER or fusion.GROUP")
    old: str | None = Field(description="null: not in the spec (its default applies)")
    new: str | None
    old_line: int | None = Field(description="the line that sets it; null when not written")
    new_line: int | None
    new_by_option: bool = Field(description="NEW's value comes from --set")


class Item(_Data):
    item: str = Field(description="the field of `msgen estimate --json` it compares")
    old: Number | None
    new: Number | None
    delta: Number | None = Field(description="new - old; null when a side lacks it")


class StageMemory(_Data):
    stage: int
    change: Change
    fits_old: bool | None
    fits_new: bool | None
    items: list[Item] = Field(description="the items that changed, and total_bytes")


class MemoryDiff(_Data):
    budget_old: int | None
    budget_new: int | None
    fits_old: bool
    fits_new: bool
    params_total: Item | None = Field(description="null when unchanged")
    stages: list[StageMemory]


class StageTime(_Data):
    stage: int
    change: Change
    terms: list[Item] = Field(description="the terms that changed, and total_s")


class TimeDiff(_Data):
    items: list[Item] = Field(description="step_s, tokens/s per device, MFU, HFU that changed")
    stages: list[StageTime]


class OpChange(_Data):
    graph: str = Field(description="a layer's name, or network")
    op: str = Field(description="the op, or `(layer)` for the layer's own recompute")
    aspect: Literal["call", "strategy", "fused", "collectives", "recompute"]
    old: str | None
    new: str | None


class ParamChange(_Data):
    params: list[str] = Field(description="paths; LAYER.*.OP.NAME for a repeated layer's")
    aspect: Literal["param", "copies", "shape", "split", "stages", "fusion_id", "gradient_from"]
    old: str | None = Field(description="for a layer's parameters: the value, or runs of copies")
    new: str | None


class FileChange(_Data):
    path: str
    change: Change
    old_lines: int
    new_lines: int
    added_lines: int
    removed_lines: int


class DiffReport(_Data):
    old: SideReport
    new: SideReport
    verdict: str = Field(description="the one line a reviewer reads first")
    changed: bool = Field(description="anything differs: a status, a setting, a number, a file")
    settings: list[SettingChange] | None
    memory: MemoryDiff | None
    time: TimeDiff | None
    ops: list[OpChange] | None
    params: list[ParamChange] | None
    files: list[FileChange] | None
    notes: list[str]
