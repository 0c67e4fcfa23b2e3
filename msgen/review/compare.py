"""Memory, step time, ops, parameters and generated files of two sides, compared.

Every number is read from what `msgen estimate --json` and `msgen compile` make of
each side (msgen.review.sides); here they are only set side by side and subtracted.
"""

from __future__ import annotations

import difflib

from msgen.estimate.report import ROWS
from msgen.estimate.time_report import TERMS
from msgen.review.model import FileChange, Item, MemoryDiff, StageMemory, StageTime, TimeDiff

MEMORY_ITEMS = ("params", *(key for key, _ in ROWS), "total_bytes")
TIME_ITEMS = ("step_s", "tokens_per_s_per_device", "mfu", "hfu")
STAGE_TERMS = (*(key for key, _ in TERMS), "total_s")


def items(old: dict | None, new: dict | None, keys, always: str | None = None) -> list[Item]:
    """The keys whose values differ (and `always`), with new - old."""
    out = []
    for key in keys:
        a = old[key] if old is not None else None
        b = new[key] if new is not None else None
        if a != b or key == always:
            delta = b - a if a is not None and b is not None else None
            out.append(Item(item=key, old=a, new=b, delta=delta))
    return out


def _by_stage(stages: list[dict]) -> dict[int, dict]:
    return {s["stage"]: s for s in stages}


def _change(old, new) -> str:
    return "changed" if old is not None and new is not None else "added" if new else "removed"


def _moved(found: list[Item]) -> bool:
    return any(i.delta != 0 for i in found)


def compare_memory(old: dict, new: dict) -> MemoryDiff:
    """Per stage, the items that changed (and the total), and stages pp added or removed."""
    a, b = _by_stage(old["stages"]), _by_stage(new["stages"])
    stages = []
    for n in sorted(a.keys() | b.keys()):
        sa, sb = a.get(n), b.get(n)
        found = items(sa, sb, MEMORY_ITEMS, always="total_bytes")
        fits_old = sa["fits"] if sa else None
        fits_new = sb["fits"] if sb else None
        if sa and sb and not _moved(found) and fits_old == fits_new:
            continue
        stages.append(StageMemory(stage=n, change=_change(sa, sb), fits_old=fits_old,
                                  fits_new=fits_new, items=found))  # fmt: skip
    total = items(old, new, ("params_total",))
    return MemoryDiff(
        budget_old=old["budget_bytes"],
        budget_new=new["budget_bytes"],
        fits_old=old["fits"],
        fits_new=new["fits"],
        params_total=total[0] if total else None,
        stages=stages,
    )


def compare_time(old: dict | None, new: dict | None) -> TimeDiff | None:
    """Step time, tokens/s, MFU and HFU, and each stage's terms that changed."""
    if old is None or new is None:
        return None
    a, b = _by_stage(old["stages"]), _by_stage(new["stages"])
    stages = []
    for n in sorted(a.keys() | b.keys()):
        found = items(a.get(n), b.get(n), STAGE_TERMS, always="total_s")
        if n in a and n in b and not _moved(found):
            continue
        stages.append(StageTime(stage=n, change=_change(a.get(n), b.get(n)), terms=found))
    return TimeDiff(items=items(old, new, TIME_ITEMS), stages=stages)


def line_changes(old: str, new: str) -> tuple[int, int]:
    """(added, removed) lines, as difflib matches them."""
    a, b = old.splitlines(), new.splitlines()
    added = removed = 0
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag != "equal":
            removed += i2 - i1
            added += j2 - j1
    return added, removed


def compare_files(old: dict[str, str], new: dict[str, str]) -> list[FileChange]:
    """The generated files added, removed and changed, with their line counts."""
    out = []
    for path in sorted(old.keys() | new.keys()):
        a, b = old.get(path), new.get(path)
        if a == b:
            continue
        added, removed = line_changes(a or "", b or "")
        out.append(
            FileChange(
                path=path,
                change=_change(a, b),
                old_lines=len((a or "").splitlines()),
                new_lines=len((b or "").splitlines()),
                added_lines=added,
                removed_lines=removed,
            )
        )
    return out
