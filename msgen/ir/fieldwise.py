"""Dataclasses that add and scale field by field: an op's work, the seconds of a
micro-batch. Sums and multiples keep the type."""

from __future__ import annotations

from dataclasses import fields
from functools import cache
from typing import Self


@cache
def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


class Fieldwise:
    """Mixin for a dataclass whose fields all add and multiply."""

    def __add__(self, other: Self) -> Self:
        names = _names(type(self))
        return type(self)(*(getattr(self, n) + getattr(other, n) for n in names))

    def __mul__(self, n: float) -> Self:
        return type(self)(*(getattr(self, name) * n for name in _names(type(self))))
