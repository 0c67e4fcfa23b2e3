"""What a check finds: ok, warning, skipped or error, with the fix."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Status(str, Enum):
    OK = "ok"
    WARNING = "warning"
    SKIPPED = "skipped"
    ERROR = "error"


@dataclass(frozen=True)
class Check:
    """One finding. `topic` groups findings (`npu`, `cann`, `port`...); `device` names
    the NPU it is about, when it is about one."""

    topic: str
    status: Status
    message: str
    fix: str = ""
    device: int | None = None

    def as_json(self) -> dict:
        out = {"topic": self.topic, "status": self.status.value, "message": self.message}
        if self.fix:
            out["fix"] = self.fix
        if self.device is not None:
            out["device"] = self.device
        return out


def ok(topic: str, message: str, device: int | None = None) -> Check:
    return Check(topic, Status.OK, message, device=device)


def warning(topic: str, message: str, fix: str, device: int | None = None) -> Check:
    return Check(topic, Status.WARNING, message, fix, device)


def error(topic: str, message: str, fix: str, device: int | None = None) -> Check:
    return Check(topic, Status.ERROR, message, fix, device)


def skipped(topic: str, why: str) -> Check:
    return Check(topic, Status.SKIPPED, why)
