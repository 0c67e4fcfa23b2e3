"""JSON from outside msgen, read so that no lie in it becomes a traceback: the file
bounded in size (and a regular file), its nesting bounded in depth, its numbers
finite and of a sane length, and its shape checked against a small schema before a
value is used. Every refusal is one `BadInput` line naming the file and the key.

A schema is a tree of the classes below (`Obj`, `Dict`, `List`, `Int`, `Num`, `Str`,
`Bool`, `Nullable`, `Anything`); `check` returns the value it was given, so a reader
says in one place what it expects and gets its document back."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path

from msgen.base.files import read_regular
from msgen.base.status import UsageError
from msgen.diagnostics import printable

MAX_DEPTH = 64  # deeper than any document msgen reads; json's own limit is a RecursionError
MAX_DIGITS = 40  # an integer literal longer than this is no count, size or offset
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


class BadInput(UsageError):
    """A file from outside msgen that is not what it must be (status 2, one line)."""


def _where(name: str, path: str) -> str:
    return f"{name}: {path}" if path else name


def _kind(value) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", int: "an integer"}.get(
        type(value), "a number"
    )


@dataclass(frozen=True)
class Schema:
    def check(self, value, name: str, path: str = ""):
        raise NotImplementedError

    def refuse(self, value, name: str, path: str, expected: str):
        raise BadInput(f"{_where(name, path)}: expected {expected}, got {_kind(value)}")


@dataclass(frozen=True)
class Anything(Schema):
    def check(self, value, name, path=""):
        return value


@dataclass(frozen=True)
class Bool(Schema):
    def check(self, value, name, path=""):
        if not isinstance(value, bool):
            self.refuse(value, name, path, "true or false")
        return value


@dataclass(frozen=True)
class Int(Schema):
    low: int | None = None
    high: int | None = None

    def check(self, value, name, path=""):
        if isinstance(value, bool) or not isinstance(value, int):
            self.refuse(value, name, path, "an integer")
        return _within(value, self.low, self.high, name, path)


@dataclass(frozen=True)
class Num(Schema):
    """A finite number (the parser already refuses NaN and infinities)."""

    low: float | None = None
    high: float | None = None

    def check(self, value, name, path=""):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.refuse(value, name, path, "a number")
        return _within(value, self.low, self.high, name, path)


@dataclass(frozen=True)
class Str(Schema):
    max_len: int = 4096

    def check(self, value, name, path=""):
        if not isinstance(value, str):
            self.refuse(value, name, path, "a string")
        if len(value) > self.max_len:
            raise BadInput(f"{_where(name, path)}: a string of {len(value)} characters")
        return value


@dataclass(frozen=True)
class Nullable(Schema):
    inner: Schema

    def check(self, value, name, path=""):
        return None if value is None else self.inner.check(value, name, path)


@dataclass(frozen=True)
class List(Schema):
    item: Schema = Anything()
    max_len: int | None = None

    def check(self, value, name, path=""):
        if not isinstance(value, list):
            self.refuse(value, name, path, "a list")
        if self.max_len is not None and len(value) > self.max_len:
            raise BadInput(f"{_where(name, path)}: {len(value)} entries, at most {self.max_len}")
        for i, item in enumerate(value):
            self.item.check(item, name, f"{path}[{i}]")
        return value


@dataclass(frozen=True)
class Dict(Schema):
    """An object whose keys are data (tensor names, weight map entries)."""

    value: Schema = Anything()
    max_len: int | None = None

    def check(self, value, name, path=""):
        if not isinstance(value, dict):
            self.refuse(value, name, path, "an object")
        if self.max_len is not None and len(value) > self.max_len:
            raise BadInput(f"{_where(name, path)}: {len(value)} keys, at most {self.max_len}")
        for key, item in value.items():
            self.value.check(item, name, _join(path, key))
        return value


@dataclass(frozen=True)
class Obj(Schema):
    """An object with named keys: `required` must be there, `optional` may be; other
    keys are left alone (a config carries many msgen does not read)."""

    required: dict[str, Schema] = field(default_factory=dict)
    optional: dict[str, Schema] = field(default_factory=dict)

    def check(self, value, name, path=""):
        if not isinstance(value, dict):
            self.refuse(value, name, path, "an object")
        for key, schema in self.required.items():
            if key not in value:
                raise BadInput(f"{_where(name, _join(path, key))}: missing")
            schema.check(value[key], name, _join(path, key))
        for key, schema in self.optional.items():
            if key in value:
                schema.check(value[key], name, _join(path, key))
        return value


def _within(value, low, high, name: str, path: str):
    if (low is not None and value < low) or (high is not None and value > high):
        raise BadInput(f"{_where(name, path)}: {value} is outside {low}..{high}")
    return value


def _join(path: str, key: str) -> str:
    key = printable(str(key))
    return f"{path}.{key}" if path else key


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise ValueError(f"an integer of {len(text.lstrip('-'))} digits")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} is not a finite number")
    return value


def _no_constant(text: str):
    raise ValueError(f"{text} is not JSON")


def depth(text: str) -> int:
    """How deeply `text`'s brackets nest (strings skipped), without parsing it."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(1 if c in "[{" else -1 for c in brackets), default=0)


def parse_json(data: bytes | str, name: str, schema: Schema | None = None):
    """The document in `data` (read from the file called `name`), checked."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise BadInput(f"{name}: not UTF-8 (byte {exc.start})") from None
    if depth(text) > MAX_DEPTH:
        raise BadInput(f"{name}: nested deeper than {MAX_DEPTH} levels")
    try:
        doc = json.loads(
            text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_no_constant
        )
    except json.JSONDecodeError as exc:
        raise BadInput(
            f"{name}: not JSON ({exc.msg}, line {exc.lineno} column {exc.colno})"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise BadInput(f"{name}: not JSON msgen reads ({printable(str(exc))})") from None
    return doc if schema is None else schema.check(doc, name)


def load_json(path: Path, limit: int, schema: Schema | None = None, name: str | None = None):
    """The JSON file `path` (a regular file of at most `limit` bytes), checked."""
    name = printable(name or str(path))
    try:
        data = read_regular(path, limit)
    except OSError as exc:
        raise BadInput(f"cannot read {name}: {exc.strerror or exc}") from None
    return parse_json(data, name, schema)
