"""Where each Hugging Face tensor goes in msgen's parameters, and back, read off the
family's mapping table (msgen.hf.families): each row bound to its layer gives the
Hugging Face names, the msgen path and the map that converts both ways. Nothing here
knows a family; a new family is a new table.

All functions are pure: arrays in, arrays out, one parameter at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

import numpy as np

from msgen.hf.config import HfModel
from msgen.hf.families import EMBEDDING, HEAD, TABLES
from msgen.hf.kinds import layer_path, runs
from msgen.hf.mapping import Weight

Get = Callable[[str], np.ndarray]


@dataclass(frozen=True)
class Bound:
    """A table row for one layer (or the model): its names and path in full."""

    hf: tuple[str, ...]
    path: str
    weight: Weight


def _bind(m: HfModel, hf: str, ms: str, rows: tuple[Weight, ...]) -> Iterator[Bound]:
    for row in rows:
        if row.present(m):
            yield Bound(row.names(m, hf), ms + row.path, row)


def bound(m: HfModel) -> Iterator[Bound]:
    """Every weight of the model, in the order the model runs them."""
    table = TABLES[m.family]
    yield from _bind(m, "", "", EMBEDDING)
    found = runs(m)
    for i in range(m.layers):
        rows = table.attention + (table.sparse if m.sparse(i) else table.dense)
        yield from _bind(m, f"model.layers.{i}.", layer_path(m, i, found) + ".", rows)
    yield from _bind(m, "", "", HEAD)


def hf_names(m: HfModel) -> list[str]:
    """Every tensor name the Hugging Face model has."""
    return [name for b in bound(m) for name in b.hf]


def hf_shapes(m: HfModel) -> dict[str, tuple[int, ...]]:
    """Every tensor of the Hugging Face model with the shape transformers gives it
    (nn.Linear weights [out, in], biases [out], embeddings [vocab, hidden])."""
    return {n: s for b in bound(m) for n, s in zip(b.hf, b.weight.hf_shapes(m), strict=True)}


def msgen_shapes(m: HfModel) -> dict[str, tuple[int, ...]]:
    """Every msgen parameter the model converts to, with its shape (no array made)."""
    return {b.path: b.weight.map.shape(m, list(b.weight.hf_shapes(m))) for b in bound(m)}


def msgen_paths(m: HfModel) -> dict[str, str]:
    """Hugging Face tensor name -> the msgen parameter it goes into."""
    return {name: b.path for b in bound(m) for name in b.hf}


def to_msgen(
    m: HfModel, get: Get, paths: Collection[str] | None = None
) -> Iterator[tuple[str, np.ndarray]]:
    """(msgen parameter path, array) for every parameter (or those in `paths`), from
    Hugging Face tensors fetched one at a time by `get(name)`."""
    for b in bound(m):
        if paths is None or b.path in paths:
            yield b.path, b.weight.map.to_msgen(m, [get(name) for name in b.hf])


def to_hf(m: HfModel, get: Get) -> Iterator[tuple[str, np.ndarray]]:
    """(Hugging Face name, array) for every tensor, from msgen parameters fetched one
    at a time by `get(path)`: the inverse of to_msgen."""
    for b in bound(m):
        arrays = b.weight.map.to_hf(m, get(b.path))
        yield from zip(b.hf, arrays, strict=True)
