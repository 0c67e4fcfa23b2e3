"""The safetensors format read and written with numpy alone, one tensor at a time.

The format (huggingface/safetensors, "Format"): 8 bytes little-endian header length N,
N bytes of JSON `{name: {"dtype", "shape", "data_offsets": [begin, end]}, ...,
"__metadata__": {str: str}}`, then the tensors' bytes, row-major, little-endian, offsets
relative to the end of the header. Reading seeks to one tensor and reads its bytes, so
host memory holds one tensor, never the file. bf16 (which numpy has no type for) is
carried as its raw 16 bits in a uint16 array, tagged with the dtype name.

Writing makes every array C-contiguous first: safetensors 0.8.0's `save_file` writes a
non-contiguous array's memory in memory order (upstream issue 825), so a transposed
weight would be saved scrambled; here the bytes are always the logical order's.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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
}
HEADER_LIMIT = 100 << 20  # safetensors' own cap on the header


class TensorFileError(Exception):
    """A file that is not safetensors, or a tensor that is not what its header says."""


@dataclass(frozen=True)
class Entry:
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def read_header(path: Path) -> tuple[dict[str, Entry], dict[str, str], int]:
    """(entries by name, metadata, offset of the data) of a safetensors file."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise TensorFileError(f"{path}: too short for safetensors")
            (size,) = struct.unpack("<Q", raw)
            if size > HEADER_LIMIT:
                raise TensorFileError(f"{path}: header of {size} bytes is not safetensors")
            header = json.loads(f.read(size).decode("utf-8"))
            total = f.seek(0, 2)
    except (UnicodeDecodeError, ValueError) as exc:
        raise TensorFileError(f"{path}: not a safetensors header ({exc})") from exc
    if not isinstance(header, dict):
        raise TensorFileError(f"{path}: not a safetensors header")
    metadata = header.pop("__metadata__", None) or {}
    entries = {}
    for name, info in header.items():
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError) as exc:
            raise TensorFileError(f"{path}: bad header entry for {name}") from exc
        if dtype not in DTYPES:
            raise TensorFileError(f"{path}: {name} has dtype {dtype}, which msgen does not read")
        need = int(np.prod(shape, dtype=np.int64)) * DTYPES[dtype].itemsize
        if end - begin != need or begin < 0 or 8 + size + end > total:
            raise TensorFileError(f"{path}: {name} is cut short or not {dtype}{list(shape)}")
        entries[name] = Entry(dtype, shape, begin, end)
    return entries, metadata, 8 + size


def read_tensor(path: Path, name: str, header=None) -> tuple[np.ndarray, str]:
    """One tensor, read from its place in the file, with its safetensors dtype name;
    `header` is the file's read_header, when the caller has it already."""
    entries, _, start = header or read_header(path)
    if name not in entries:
        raise TensorFileError(f"{path}: no tensor {name}")
    e = entries[name]
    data = bytearray(e.end - e.begin)  # read into place: the tensor is in memory once
    with open(path, "rb") as f:
        f.seek(start + e.begin)
        got = f.readinto(data)
    if got != len(data):
        raise TensorFileError(f"{path}: {name} is cut short")
    return np.frombuffer(data, DTYPES[e.dtype]).reshape(e.shape), e.dtype


def as_float32(array: np.ndarray, dtype: str) -> np.ndarray:
    """A float tensor as fp32: exact for fp32, fp16 and bf16 (whose bits are fp32's top
    half)."""
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
