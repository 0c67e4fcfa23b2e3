"""The tensor names and shapes a MindSpore `.ckpt` holds, read without its data.

A `.ckpt` is a run of serialized protobuf `Checkpoint` messages (train/checkpoint.proto
in MindSpore; train/serialization.py `_exec_save` writes one per tensor, and
`_parse_ckpt_proto` parses the whole file as one message, dropping a trailing
`crc_num` record): `Checkpoint { repeated Value value = 1; }`, `Value { required string
tag = 1; oneof { TensorProto tensor = 2; MapTensorProto maptensor = 3; } }`,
`TensorProto { repeated int64 dims = 1; required string tensor_type = 2; required bytes
tensor_content = 3; }`. This reads the protobuf wire format field by field and seeks
past every tensor's bytes, so a rank's file costs a few reads per tensor, not its size.
A file that is not this format is a CkptFileError at the byte where it stops being one.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

CRC_TAIL = 17  # b"crc_num" and 10 bytes of CRC, when save_checkpoint(crc_check=True)
_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5
MAX_NAME = 1 << 16  # no parameter path is longer


class CkptFileError(ValueError):
    """Not a checkpoint MindSpore wrote."""


class _Reader:
    def __init__(self, f, end: int):
        self.f, self.end = f, end

    def at(self) -> int:
        return self.f.tell()

    def span(self, limit: int) -> int:
        """The end of the length-delimited field whose length is next."""
        size = self.varint(limit)
        self.need(size, limit)
        return self.at() + size

    def need(self, n: int, limit: int) -> None:
        if n < 0 or self.at() + n > limit:
            raise CkptFileError(f"a field runs past its end at byte {self.at()}")

    def varint(self, limit: int) -> int:
        value = shift = 0
        while True:
            self.need(1, limit)
            (byte,) = self.f.read(1)
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7
            if shift > 63:
                raise CkptFileError(f"a varint longer than 10 bytes at byte {self.at()}")

    def key(self, limit: int) -> tuple[int, int]:
        key = self.varint(limit)
        return key >> 3, key & 7

    def skip(self, wire: int, limit: int) -> None:
        size = {_FIXED64: 8, _FIXED32: 4}.get(wire)
        if wire == _VARINT:
            self.varint(limit)
            return
        if wire == _BYTES:
            size = self.varint(limit)
        if size is None:
            raise CkptFileError(f"wire type {wire} at byte {self.at()}")
        self.need(size, limit)
        self.f.seek(size, os.SEEK_CUR)

    def text(self, limit: int) -> str:
        size = self.varint(limit)
        self.need(size, limit)
        if size > MAX_NAME:
            raise CkptFileError(f"a name of {size} bytes at byte {self.at()}")
        try:
            return self.f.read(size).decode("utf-8")
        except UnicodeDecodeError:
            raise CkptFileError(f"a name that is not UTF-8 at byte {self.at()}") from None


def _tensor(r: _Reader, limit: int) -> tuple[tuple[int, ...], str]:
    dims, kind = [], ""
    while r.at() < limit:
        field, wire = r.key(limit)
        if field == 2 and wire == _BYTES:
            kind = r.text(limit)
        elif field == 1 and wire == _VARINT:
            dims.append(r.varint(limit))
        elif field == 1 and wire == _BYTES:  # packed
            end = r.span(limit)
            while r.at() < end:
                dims.append(r.varint(end))
        else:
            r.skip(wire, limit)
    if any(d >= 1 << 63 for d in dims):  # int64: a negative dim
        raise CkptFileError(f"a negative dim before byte {limit}")
    return (() if dims == [0] else tuple(dims)), kind  # [0]: a scalar (_load_ckpt_...)


def _value(r: _Reader, limit: int) -> tuple[str | None, tuple | None]:
    name = shape = None
    while r.at() < limit:
        field, wire = r.key(limit)
        if field == 1 and wire == _BYTES:
            name = r.text(limit)
        elif field == 2 and wire == _BYTES:
            shape = _tensor(r, r.span(limit))
        else:
            r.skip(wire, limit)
    return name, shape


def tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """name -> shape of every tensor in the checkpoint. As load_checkpoint reads it
    (serialization.py `_load_ckpt_into_param_dict`): consecutive records of one name are
    the chunks of one tensor (save_checkpoint splits one above 512 MiB), dims [0] is a
    scalar; a string (an append_dict value) or a map tensor has no shape and is left out
    (msgen writes none)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb", buffering=1 << 16) as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CkptFileError("not a regular file")
        size = os.fstat(fd).st_size
        f.seek(max(size - CRC_TAIL, 0))
        end = size - CRC_TAIL if f.read(7) == b"crc_num" else size
        f.seek(0)
        r = _Reader(f, end)
        shapes: dict[str, tuple[int, ...]] = {}
        last = None
        while r.at() < end:
            field, wire = r.key(end)
            if field != 1 or wire != _BYTES:
                raise CkptFileError(f"field {field} where a tensor goes, at byte {r.at()}")
            limit = r.span(end)
            name, tensor = _value(r, limit)
            if name is None:
                raise CkptFileError(f"a tensor with no name before byte {limit}")
            if name != last and name in shapes:
                raise CkptFileError(f"two tensors named {name}")
            if tensor is not None and tensor[1] != "str":
                shapes[name] = tensor[0]
            last = name
    if not shapes:
        raise CkptFileError("no tensor in it")
    return shapes
