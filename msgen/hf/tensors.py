"""The safetensors format read and written with numpy alone, one tensor at a time.

The format (huggingface/safetensors, "Format"): 8 bytes little-endian header length N,
N bytes of JSON `{name: {"dtype", "shape", "data_offsets": [begin, end]}, ...,
"__metadata__": {str: str}}`, then the tensors' bytes, row-major, little-endian, offsets
relative to the end of the header. Reading seeks to one tensor and reads its bytes, so
host memory holds one tensor, never the file. bf16 (which numpy has no type for) is
carried as its raw 16 bits in a uint16 array, tagged with the dtype name; float8 e4m3
as its 8-bit codes (msgen.hf.fp8 decodes them with their block scales).

Writing makes every array C-contiguous first: safetensors 0.8.0's `save_file` writes a
non-contiguous array's memory in memory order (upstream issue 825), so a transposed
weight would be saved scrambled; here the bytes are always the logical order's.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path

import numpy as np

from msgen.base.readers import BadInput, Dict, Int, List, Nullable, Obj, Str, parse_json
from msgen.diagnostics import printable

# safetensors dtype names -> numpy dtypes (bf16 as its raw bits)
DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
    "F8_E4M3": np.dtype("u1"),  # float8_e4m3fn's codes, decoded by msgen.hf.fp8
}
HEADER_LIMIT = 100 << 20  # safetensors' own cap on the header


class TensorFileError(BadInput):
    """A file that is not safetensors, or a tensor that is not what its header says."""


@dataclass(frozen=True)
class Entry:
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


ENTRY = Obj(
    required={
        "dtype": Str(max_len=16),
        "shape": List(Int(0), max_len=64),
        "data_offsets": List(Int(0), max_len=2),
    }
)
METADATA = Nullable(Dict(Str(max_len=HEADER_LIMIT)))  # safetensors: str -> str, or none


def _open_regular(path: Path):
    """`path` opened for reading if it is a regular file (through links): a FIFO is
    not waited on, a device not read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise TensorFileError(f"{printable(str(path))}: not a regular file")
    return os.fdopen(fd, "rb")


def _unique(pairs: list) -> dict:
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        twice = next(n for i, n in enumerate(names) if n in names[:i])
        raise ValueError(f"the name {printable(twice)} is there twice")
    return dict(pairs)


def _entries(header: dict, shown: str, data_size: int) -> dict[str, Entry]:
    """The tensors of a checked header, validated as safetensors validates them
    (safetensors/src/tensor.rs, `Metadata::validate` and `read_metadata`): each
    tensor's bytes its dtype and shape's size, and, in offset order, the tensors one
    after another from 0 (no gap, no overlap) to the end of the file."""
    entries = {}
    for name, info in header.items():
        where = f"{shown}: {printable(name)}"
        if info["dtype"] not in DTYPES:
            raise TensorFileError(f"{where}: dtype {printable(info['dtype'])}, which msgen "
                                  "does not read")  # fmt: skip
        if len(info["data_offsets"]) != 2:
            raise TensorFileError(f"{where}: data_offsets is not [begin, end]")
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if prod(d for d in shape if d) * DTYPES[info["dtype"]].itemsize >= 1 << 63:
            raise TensorFileError(f"{where}: shape {list(shape)} is larger than any array")
        if end - begin != prod(shape) * DTYPES[info["dtype"]].itemsize:
            raise TensorFileError(
                f"{where}: data_offsets [{begin}, {end}] do not hold {info['dtype']}{list(shape)}"
            )
        entries[name] = Entry(info["dtype"], shape, begin, end)
    at = 0
    for name, e in sorted(entries.items(), key=lambda item: (item[1].begin, item[1].end)):
        if e.begin != at:
            what = "overlaps the tensor before it" if e.begin < at else "leaves a gap before it"
            raise TensorFileError(f"{shown}: {printable(name)}: data_offsets {what}")
        at = e.end
    if at != data_size:
        raise TensorFileError(
            f"{shown}: the tensors' data ends at byte {at} of the {data_size} after the header"
        )
    return entries


def read_header(path: Path) -> tuple[dict[str, Entry], dict[str, str], int]:
    """(entries by name, metadata, offset of the data) of a safetensors file, every
    value checked before any is used: one BadInput line naming the file and the key."""
    shown = printable(str(path))
    with _open_regular(path) as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise TensorFileError(f"{shown}: too short for safetensors")
        (size,) = struct.unpack("<Q", raw)
        total = os.fstat(f.fileno()).st_size
        if size > HEADER_LIMIT or 8 + size > total:  # the number itself is not shown
            raise TensorFileError(f"{shown}: its first 8 bytes are no safetensors header size")
        text = f.read(size)
    header = parse_json(text, shown, Dict())
    try:
        json.loads(text, object_pairs_hook=_unique)
    except ValueError as exc:
        raise TensorFileError(f"{shown}: {exc}") from None
    metadata = METADATA.check(header.pop("__metadata__", None), shown, "__metadata__") or {}
    Dict(ENTRY).check(header, shown)
    return _entries(header, shown, total - 8 - size), metadata, 8 + size


def read_tensor(path: Path, name: str, header=None) -> tuple[np.ndarray, str]:
    """One tensor, read from its place in the file, with its safetensors dtype name;
    `header` is the file's read_header, when the caller has it already."""
    entries, _, start = header or read_header(path)
    if name not in entries:
        raise TensorFileError(f"{printable(str(path))}: no tensor {printable(name)}")
    e = entries[name]
    data = bytearray(e.end - e.begin)  # read into place: the tensor is in memory once
    with _open_regular(path) as f:
        f.seek(start + e.begin)
        got = f.readinto(data)
    if got != len(data):
        raise TensorFileError(f"{printable(str(path))}: {printable(name)} is cut short")
    return np.frombuffer(data, DTYPES[e.dtype]).reshape(e.shape), e.dtype


def as_float32(array: np.ndarray, dtype: str) -> np.ndarray:
    """A float tensor as fp32: exact for fp32, fp16 and bf16 (whose bits are fp32's top
    half). FP8 codes are no floats until their scales apply (msgen.hf.fp8)."""
    if dtype == "F8_E4M3":
        raise ValueError("F8_E4M3 codes are dequantized with their scales (msgen.hf.fp8)")
    if dtype == "BF16":
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(np.float32, copy=False)


def from_float32(array: np.ndarray, dtype: str) -> np.ndarray:
    """fp32 back to `dtype`; bf16 rounds to nearest, ties to even, as torch does
    (a value that came from bf16 comes back bit-identical)."""
    array = np.ascontiguousarray(array, dtype=np.float32)
    if dtype == "BF16":
        bits = array.view(np.uint32)
        rounded = bits + (np.uint32(0x7FFF) + ((bits >> 16) & 1))
        out = (rounded >> 16).astype(np.uint16)
        nan = np.isnan(array)
        out[nan] = (bits[nan] >> 16).astype(np.uint16) | 0x40  # stays a NaN
        return out
    return array.astype(DTYPES[dtype])


def encode(tensors: dict[str, tuple[np.ndarray, str]], metadata: dict[str, str]) -> list[bytes]:
    """The chunks of a safetensors file holding `tensors` (name -> (array, dtype)), in
    name order, each array's bytes in its logical (C) order."""
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    chunks, offset = [], 0
    for name in sorted(tensors):
        array, dtype = tensors[name]
        if array.dtype != DTYPES[dtype]:
            raise ValueError(f"{name}: {array.dtype} array given as {dtype}")
        data = np.ascontiguousarray(array).tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    head = json.dumps(header, separators=(",", ":")).encode("utf-8")
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned
    return [struct.pack("<Q", len(head)), head, *chunks]
