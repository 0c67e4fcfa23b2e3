"""A one-line progress report on a terminal; silent otherwise.

    msgen data: tokenizing 41.9 of 120.0 MB (35%), 5 of 14 units, 12,345 documents,
    9.8 M tokens, 3.1 MB/s, 25 s left

Bytes are bytes of the input files as stored (compressed, for a `.gz`), so the
total is known before the first is read; the time left is the phase's bytes to go
at the phase's rate so far. Workers report a unit when it is done.
"""

from __future__ import annotations

import os
import sys
import time

INTERVAL = 0.25  # seconds between redraws


def duration(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class Progress:
    def __init__(self, label: str, total: int, enabled: bool | None = None, units: int = 0):
        if enabled is None:
            enabled = sys.stderr.isatty() and not os.environ.get("CI")
        self.label, self.total, self.enabled, self.units_total = label, total, enabled, units
        self.last = time.monotonic()
        self.phase(None)

    def phase(self, name: str | None) -> None:
        """Start a phase: `training the tokenizer`, `tokenizing`, `writing the index`."""
        self.name, self.start = name, time.monotonic()
        self.bytes = self.documents = self.tokens = self.units = 0
        if name is not None:
            self.draw(force=True)

    def update(self, position: int, documents: int = 0, tokens: int = 0, units: int = 0) -> None:
        """`position`: bytes of the input read so far in this phase."""
        self.bytes = position
        self.units += units
        self.documents += documents
        self.tokens += tokens
        self.draw(force=units > 0)  # a unit done is news however recent the last draw

    def line(self, now: float) -> str:
        elapsed = max(now - self.start, 1e-9)
        parts = [f"{self.label}: {self.name}"]
        if self.total:
            share = min(self.bytes / self.total, 1.0)
            parts[0] += f" {self.bytes / 1e6:,.1f} of {self.total / 1e6:,.1f} MB ({share:.0%})"
        if self.units_total:
            parts.append(f"{self.units:,} of {self.units_total:,} units")
        if self.documents:
            parts.append(f"{self.documents:,} documents")
        if self.tokens:
            parts.append(f"{self.tokens / 1e6:,.1f} M tokens")
        if self.bytes and elapsed > 1:
            rate = self.bytes / elapsed
            parts.append(f"{rate / 1e6:,.1f} MB/s")
            if self.total > self.bytes:
                parts.append(f"{duration((self.total - self.bytes) / rate)} left")
        return ", ".join(parts)

    def draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.enabled and self.name is not None and (force or now - self.last >= INTERVAL):
            self.last = now
            sys.stderr.write(f"\r{self.line(now)}\x1b[K")
            sys.stderr.flush()

    def done(self) -> None:
        if self.enabled:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
