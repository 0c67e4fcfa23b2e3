"""The spec's data as train.py will open it: the file exists, is a MindRecord with an
int32 `input_ids` column of seq + 1 ids a sample, and matches the dataset.json beside
it (vocab and seq), the checks train.py makes before it builds the model.

A MindRecord file starts with its header's length (uint64, little-endian) and the
header as JSON, which holds the schema (MindSpore's mindrecord/shard_header format,
seen in files FileWriter writes): that much is read here. A sample's length needs
MindSpore's reader, so it is read in the interpreter msrun will start.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from msgen.doctor.result import Check, error, ok, skipped
from msgen.doctor.tools import Tools

SAMPLE = (
    "import sys\n"
    "from mindspore.mindrecord import FileReader\n"
    "reader = FileReader(sys.argv[1], num_consumer=1)\n"
    "row = next(reader.get_next(), None)\n"
    "reader.close()\n"
    "print('msgen-sample', -1 if row is None else len(row['input_ids']))\n"
)
SAMPLE_TIMEOUT_S = 120.0  # MindSpore's import is most of it


def mindrecord_header(path: Path) -> dict | None:
    """The JSON header of a MindRecord file, or None when it is not one."""
    try:
        with path.open("rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                return None
            (size,) = struct.unpack("<Q", raw)
            if not 0 < size < 1 << 26:
                return None
            header = json.loads(f.read(size).rstrip(b"\0").decode())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return header if isinstance(header, dict) and "schema" in header else None


def input_ids_type(header: dict) -> str | None:
    for entry in header.get("schema") or ():
        column = (entry.get("schema") or {}).get("input_ids") if isinstance(entry, dict) else None
        if isinstance(column, dict):
            return column.get("type")
    return None


def sample_length(tools: Tools, path: Path) -> int | str:
    """The first sample's id count, or why it could not be read."""
    out = tools.run("python", "-c", SAMPLE, str(path), timeout=SAMPLE_TIMEOUT_S)
    if out is None:
        return "no `python` on PATH to read it with"
    if out.failure():
        return out.failure()
    for line in out.stdout.splitlines():
        if line.startswith("msgen-sample "):
            return int(line.split()[1])
    return "the reader printed no sample"


def listed_files(manifest: Path, role: str) -> list[Path] | str:
    """The files a dataset.json of msgen data lists for `role`, or what is wrong."""
    try:
        meta = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return f"{manifest} is not a dataset.json of msgen data"
    listed = (meta.get("files") or {}).get(role) if isinstance(meta, dict) else None
    listed = [listed] if isinstance(listed, str) else listed
    if not listed or not isinstance(listed, list) or not all(isinstance(n, str) for n in listed):
        return f"{manifest} lists no {role} files"
    paths = [manifest.parent / name for name in listed]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        return f"{missing[0]}: listed in {manifest} and missing ({len(missing)} of {len(paths)})"
    return paths


def data_checks(
    tools: Tools, files: list[tuple[str, str]], base: Path, vocab: int, seq: int
) -> list[Check]:
    """`files`: (role, path as the spec writes it); relative paths resolve against `base`."""
    if not files:
        return [skipped("data", "the spec names no data (train.py runs with --synthetic only)")]
    found: list[Check] = []
    for role, written in files:
        path = Path(written) if Path(written).is_absolute() else base / written
        if path.suffix == ".json" and path.is_file():
            listed = listed_files(path, role)
            if isinstance(listed, str):
                found.append(error("data", listed, "rerun msgen data"))
                continue
            path = listed[0]  # the sets' files share one schema; train.py reads them all
        if not path.is_file():
            found.append(error("data", f"{role} data {path} not found (the spec's {written!r}, "
                               f"resolved against {base})", "make it with `msgen data SPEC INPUT...`, "
                               "or point --tree/--run-from at the folder train.py runs from"))  # fmt: skip
            continue
        header = mindrecord_header(path)
        if header is None:
            found.append(
                error("data", f"{path} is not a MindRecord file", "make it with msgen data")
            )
            continue
        if input_ids_type(header) != "int32":
            found.append(
                error("data", f"{path} has no int32 input_ids column", "make it with msgen data")
            )
            continue
        meta_path = path.parent / "dataset.json"
        if meta_path.is_file():
            try:
                meta = json.loads(meta_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                meta = {}
            if (meta.get("vocab"), meta.get("seq")) != (vocab, seq):
                found.append(error("data", f"{meta_path}: made for vocab={meta.get('vocab')}, seq={meta.get('seq')}; "
                                   f"the spec has vocab={vocab}, seq={seq}", "rerun msgen data for this spec"))  # fmt: skip
                continue
        length = sample_length(tools, path)
        if isinstance(length, str):
            found.append(skipped("data", f"{path}: sample length not read ({length})"))
        elif length != seq + 1:
            found.append(error("data", f"{path}: samples have {length} ids; the spec's seq + 1 is {seq + 1}",
                               "rerun msgen data for this spec"))  # fmt: skip
        else:
            found.append(ok("data", f"{role} data {path}: MindRecord, {seq + 1} ids a sample"))
    return found
