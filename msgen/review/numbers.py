"""Numbers of the diff as `msgen estimate` prints them, and their signed deltas."""

from __future__ import annotations

from msgen.diagnostics import format_bytes
from msgen.estimate.time_report import seconds

NONE = "—"  # a value a side does not have


def count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def value(key: str, x) -> str:
    """An item of `msgen estimate --json`, named by its field."""
    if x is None:
        return NONE
    if key in ("mfu", "hfu"):
        return f"{x:.1%}"
    if key.endswith("_s"):
        return seconds(x)
    if key.endswith("_bytes"):
        return format_bytes(x)
    return f"{x:,.0f}"


def delta(key: str, d) -> str:
    """new - old, signed; MFU and HFU in percentage points."""
    if d is None:
        return NONE
    if key in ("mfu", "hfu"):
        return f"{d * 100:+.1f} pp"
    return ("-" if d < 0 else "+") + value(key, abs(d))
