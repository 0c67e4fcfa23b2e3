"""A case run in a worker process that is killed when it runs too long or grows too
large: what an in-process alarm cannot stop (a read of a FIFO or a loop inside C code
ignores SIGALRM) and what it cannot bound (a set of 10^8 ranks takes the machine's
memory before any alarm). The worker imports once and runs case after case (msgen,
and MindSpore for the checkpoint cases, load once); a killed worker is replaced.

    guard = Guard("tests.file_mutations:guarded_case", seconds=20, memory=2 << 30)
    done, result = guard.run(seed, index)  # result, or what went wrong in words
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import time

POLL = 0.02  # seconds between looks at the worker's time and memory


def _serve(target: str, conn) -> None:
    module, _, name = target.partition(":")
    function = getattr(importlib.import_module(module), name)
    while True:
        args = conn.recv()
        try:
            conn.send((True, function(*args)))
        except Exception as exc:  # the function's own failure, not a case's
            conn.send((False, f"the worker's function raised {type(exc).__name__}: {exc}"))


def rss(pid: int) -> int:
    """The resident memory of process `pid`, in bytes (Linux's /proc)."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Guard:
    def __init__(self, target: str, seconds: float, memory: int):
        self.target, self.seconds, self.memory = target, seconds, memory
        self.context = multiprocessing.get_context("spawn")
        self.process = None
        self.restarts = 0

    def _start(self) -> None:
        self.conn, child = self.context.Pipe()
        self.process = self.context.Process(target=_serve, args=(self.target, child), daemon=True)
        self.process.start()
        child.close()

    def _stop(self, replaced: bool = True) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.join()
            self.conn.close()
            self.process = None
            self.restarts += replaced

    def run(self, *args) -> tuple[bool, object]:
        """(True, the function's result) or (False, what went wrong, in words)."""
        if self.process is None:
            self._start()
        self.conn.send(args)
        began, peak = time.monotonic(), 0
        while True:
            try:
                if self.conn.poll(POLL):
                    return self.conn.recv()
            except (EOFError, OSError):  # the worker is gone: its end of the pipe closed
                pass
            if not self.process.is_alive():
                self.process.join()
                code = self.process.exitcode
                self._stop()
                return False, f"the worker died (exit code {code})"
            try:
                peak = max(peak, rss(self.process.pid))
            except OSError:  # gone between the two looks
                continue
            if time.monotonic() - began > self.seconds:
                self._stop()
                return False, f"took more than {self.seconds:g} s"
            if peak > self.memory:
                self._stop()
                return False, f"grew past {self.memory / 2**30:g} GiB"

    def close(self) -> None:
        self._stop(replaced=False)
