"""A one-line progress report (MB/s and documents/s) on a terminal; silent otherwise."""

from __future__ import annotations

import os
import sys
import time

INTERVAL = 0.25  # seconds between redraws


class Progress:
    def __init__(self, label: str, enabled: bool | None = None):
        if enabled is None:
            enabled = sys.stderr.isatty() and not os.environ.get("CI")
        self.label, self.enabled = label, enabled
        self.start = self.last = time.monotonic()
        self.bytes = self.documents = 0

    def update(self, nbytes: int, documents: int) -> None:
        self.bytes += nbytes
        self.documents += documents
        now = time.monotonic()
        if self.enabled and now - self.last >= INTERVAL:
            self.last = now
            elapsed = max(now - self.start, 1e-9)
            sys.stderr.write(
                f"\r{self.label}: {self.bytes / 1e6:,.1f} MB, {self.documents:,} documents "
                f"({self.bytes / 1e6 / elapsed:,.1f} MB/s, {self.documents / elapsed:,.0f} docs/s)"
                "\x1b[K"
            )
            sys.stderr.flush()

    def done(self) -> None:
        if self.enabled:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
