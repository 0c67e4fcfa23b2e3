"""--resume: which units a killed run finished, so they are not done again.

A unit is done when its record is in the staging folder (written last, by a rename,
after its files are committed), the record's key is the unit's key now (the same
input file, size and modification time, the same part of it, the same options and
tokenizer, the same duplicates to drop), and every file it names has the digest
it recorded: in the staging folder, or already moved into the output folder by a
commit that was cut short. Any other unit is done again.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from msgen.data.units import Unit
from msgen.data.work import UnitResult, record_path, sha256_file


def fingerprint(**options) -> str:
    """What, beside the unit itself, decides a unit's files."""
    return hashlib.sha256(json.dumps(options, sort_keys=True, default=str).encode()).hexdigest()


def unit_key(unit: Unit, options: str, drop: frozenset[int]) -> str:
    dropped = ",".join(map(str, sorted(drop)))
    text = f"{options}/{unit.key()}/{hashlib.sha256(dropped.encode()).hexdigest()}"
    return hashlib.sha256(text.encode()).hexdigest()


def where(name: str, stage: Path, folder: Path) -> Path | None:
    for base in (stage, folder):
        if (base / name).is_file():
            return base / name
    return None


def done(units: list[Unit], keys: dict[int, str], stage: Path, folder: Path) -> dict:
    """The results of the units a previous run finished, by index."""
    found = {}
    for unit in units:
        path = record_path(stage, unit.index)
        try:
            record = json.loads(path.read_text("utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or record.get("key") != keys[unit.index]:
            continue
        files = record.get("files") or {}
        located = {name: where(name, stage, folder) for name in files}
        if all(p is not None and sha256_file(p) == files[n] for n, p in located.items()):
            found[unit.index] = UnitResult.from_record(unit.index, record)
        else:
            path.unlink(missing_ok=True)  # a file of it changed: the unit is done again
    return found
