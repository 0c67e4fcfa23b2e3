"""The host's tools (npu-smi, hccn_tool, python), each call bounded by a timeout.

A tool that is not on PATH is `None`, never an error: the checks that need it are
skipped with that reason. A tool that hangs (a wedged driver, an unreachable peer) is
stopped at its timeout and reported as such.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

TIMEOUT_S = 10.0  # npu-smi and hccn_tool answer in well under a second on a healthy host


@dataclass(frozen=True)
class Output:
    argv: tuple[str, ...]
    returncode: int | None  # None: stopped at the timeout
    stdout: str
    stderr: str

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def failure(self) -> str:
        """Why the call gave no answer, in a line ("" when it did)."""
        if self.timed_out:
            return f"`{' '.join(self.argv)}` did not answer within its timeout"
        if self.returncode:
            said = (self.stderr or self.stdout).strip().splitlines()
            return f"`{' '.join(self.argv)}` failed (exit {self.returncode})" + (
                f": {said[-1]}" if said else ""
            )
        return ""


@dataclass(frozen=True)
class Tools:
    """Runs the host's tools as found on `environ`'s PATH, with that environment."""

    environ: Mapping[str, str]
    timeout: float = TIMEOUT_S

    def which(self, name: str) -> str | None:
        return shutil.which(name, path=self.environ.get("PATH", os.defpath))

    def run(self, name: str, *args: str, timeout: float | None = None) -> Output | None:
        """`name args...`, or None when `name` is not on PATH."""
        exe = self.which(name)
        if exe is None:
            return None
        argv = (name, *args)
        try:
            # A session of its own, so that a timeout stops what the tool started too
            # (a wrapper script's children would hold the pipes open otherwise).
            proc = subprocess.Popen(
                [exe, *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
                env=dict(self.environ),
                start_new_session=True,
            )
        except OSError as exc:  # found but not runnable (permissions, a bad interpreter line)
            return Output(argv, 126, "", str(exc))
        try:
            stdout, stderr = proc.communicate(timeout=self.timeout if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            stdout, _ = proc.communicate()
            return Output(argv, None, stdout, "")
        return Output(argv, proc.returncode, stdout, stderr)
