"""The host's tools (npu-smi, hccn_tool, python), each call bounded in time and in
what it may print.

A tool that is not on PATH is `None`, never an error: the checks that need it are
skipped with that reason. A tool that hangs (a wedged driver, an unreachable peer) is
stopped at its timeout, and one that prints more than OUTPUT_CAP (a tool in a loop) is
stopped there; either is reported as such. The call returns within its timeout plus
AFTER_KILL_S whatever the tool's children do: the tool runs in a session of its own
and its whole process group is killed, and a child that left the group (`setsid`, a
daemon) and still holds the pipes is not waited for: the pipes are read against a
deadline and closed, never drained to their end.

What a tool printed reaches doctor's messages quoted printably (terminal escapes in a
tool's error line are shown, not acted on).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass

from msgen.diagnostics import printable

TIMEOUT_S = 10.0  # npu-smi and hccn_tool answer in well under a second on a healthy host
OUTPUT_CAP = 1 << 20  # bytes per stream; `npu-smi info` of a 16-NPU host is some 10 KiB
AFTER_KILL_S = 1.0  # the second, bounded wait: for the killed tool and its pipes
CHUNK = 1 << 16


@dataclass(frozen=True)
class Output:
    argv: tuple[str, ...]
    returncode: int | None  # None: stopped (at the timeout, or at the output cap)
    stdout: str
    stderr: str
    overflowed: bool = False  # stopped because it printed more than OUTPUT_CAP

    @property
    def timed_out(self) -> bool:
        """Stopped before it finished: no answer to read."""
        return self.returncode is None

    def failure(self) -> str:
        """Why the call gave no answer, in a line ("" when it did)."""
        command = printable(" ".join(self.argv))
        if self.overflowed:
            return f"`{command}` printed more than {OUTPUT_CAP >> 20} MiB: stopped"
        if self.timed_out:
            return f"`{command}` did not answer within its timeout"
        if self.returncode:
            said = (self.stderr or self.stdout).strip().splitlines()
            return f"`{command}` failed (exit {self.returncode})" + (
                f": {said[-1]}" if said else ""
            )
        return ""


def _text(data: bytes) -> str:
    """The bytes as text with universal newlines (as text-mode pipes give them), every
    other character a terminal acts on escaped."""
    text = data.decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")
    return printable(text, keep="\n\t")


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _read(proc: subprocess.Popen, timeout: float) -> tuple[dict[int, bytearray], str | None, bool]:
    """What the tool prints on each pipe (by file descriptor) until it exits with both
    closed, the deadline, the cap, or AFTER_KILL_S after it exited with a pipe still
    held (by a child it left behind); why it was stopped ("timeout", "overflow" or
    None); and whether a pipe was still open."""
    taken = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        for fd in taken:
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        exited_at = None
        while True:
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if not selector.get_map():  # both pipes closed: wait for the exit
                if exited_at is not None:
                    return taken, None, False
                try:
                    proc.wait(timeout=max(deadline - now, 0))
                except subprocess.TimeoutExpired:
                    return taken, "timeout", False
                continue
            if exited_at is not None and now >= exited_at + AFTER_KILL_S:
                return taken, None, True  # it answered; what it left holds a pipe
            if now >= deadline:
                return taken, "timeout", True
            for key, _ in selector.select(min(deadline - now, 0.05)):
                try:
                    chunk = os.read(key.fd, CHUNK)
                except BlockingIOError:
                    continue
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                taken[key.fd] += chunk
                if len(taken[key.fd]) > OUTPUT_CAP:
                    return taken, "overflow", True


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
                env=dict(self.environ),
                start_new_session=True,
            )
        except OSError as exc:  # found but not runnable (permissions, a bad interpreter line)
            return Output(argv, 126, "", printable(str(exc)))
        out, err = proc.stdout.fileno(), proc.stderr.fileno()
        stopped, held = "interrupted", True
        try:
            taken, stopped, held = _read(proc, self.timeout if timeout is None else timeout)
        finally:
            proc.stdout.close()  # nothing more is read, whoever holds the other ends
            proc.stderr.close()
            if stopped or held:
                # What is left of its group goes (a daemon that left it stays: not ours).
                _kill_group(proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=AFTER_KILL_S)
        if stopped:
            return Output(argv, None, _text(taken[out]), "", overflowed=stopped == "overflow")
        return Output(argv, proc.returncode, _text(taken[out]), _text(taken[err]))
