"""Where each Hugging Face tensor goes in msgen's parameters, and back, read off the
family's mapping table (msgen.hf.families): each row bound to its layer gives the
Hugging Face names, the msgen path and the map that converts both ways. Nothing here
knows a family; a new family is a new table.

A multi-token prediction layer i (DeepSeek-V3's, `num_nextn_predict_layers`) is
Hugging Face layer num_hidden_layers + i and msgen's `mtp.layers.{i}`: its family's
`mtp` rows, and its block's rows (a main layer's, of the sort of the last main layer,
whose layer kind the spec's `mtp` copies) under `block.`. Its tied copies are not
parameters: `to_msgen` leaves them out, `check_copies` holds them equal to what they
copy, and `to_hf` writes them from that parameter.

All functions are pure: arrays in, arrays out, one parameter at a time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

import numpy as np

from msgen.analysis.mtp import PREFIX as MTP_PREFIX
from msgen.base.status import UsageError
from msgen.diagnostics import printable
from msgen.hf.families import EMBEDDING, HEAD, TABLES
from msgen.hf.kinds import layer_path, runs
from msgen.hf.mapping import Weight
from msgen.hf.model import HfModel

Get = Callable[[str], np.ndarray]


class CopyError(UsageError):
    """A tensor the checkpoint holds as a copy of another that is not equal to it."""


@dataclass(frozen=True)
class Bound:
    """A table row for one layer (or the model): its names and path in full."""

    hf: tuple[str, ...]
    path: str
    weight: Weight


def _bind(m: HfModel, hf: str, ms: str, rows: tuple[Weight, ...]) -> Iterator[Bound]:
    for row in rows:
        if row.present(m):  # a tied copy's path is the model's own parameter
            yield Bound(row.names(m, hf), row.path if row.tied else ms + row.path, row)


def bound(m: HfModel) -> Iterator[Bound]:
    """Every weight of the model, in the order the model runs them."""
    table = TABLES[m.family]
    yield from _bind(m, "", "", EMBEDDING)
    found = runs(m)
    for i in range(m.layers):
        rows = table.attention + (table.sparse if m.sparse(i) else table.dense)
        yield from _bind(m, f"model.layers.{i}.", layer_path(m, i, found) + ".", rows)
    yield from _bind(m, "", "", HEAD)
    block = table.attention + (table.sparse if m.sparse(m.layers - 1) else table.dense)
    for i in range(m.mtp):
        hf, ms = f"model.layers.{m.layers + i}.", f"{MTP_PREFIX}.{i}."
        yield from _bind(m, hf, ms, table.mtp)
        yield from _bind(m, hf, ms + "block.", block)


def _owned(m: HfModel) -> Iterator[Bound]:
    """The rows that are msgen parameters: every one but the tied copies."""
    return (b for b in bound(m) if not b.weight.tied)


def hf_names(m: HfModel) -> list[str]:
    """Every tensor name the Hugging Face model has."""
    return [name for b in bound(m) for name in b.hf]


def hf_shapes(m: HfModel) -> dict[str, tuple[int, ...]]:
    """Every tensor of the Hugging Face model with the shape transformers gives it
    (nn.Linear weights [out, in], biases [out], embeddings [vocab, hidden])."""
    return {n: s for b in bound(m) for n, s in zip(b.hf, b.weight.hf_shapes(m), strict=True)}


def msgen_shapes(m: HfModel) -> dict[str, tuple[int, ...]]:
    """Every msgen parameter the model converts to, with its shape (no array made)."""
    return {b.path: b.weight.map.shape(m, list(b.weight.hf_shapes(m))) for b in _owned(m)}


def to_msgen(
    m: HfModel, get: Get, paths: Collection[str] | None = None
) -> Iterator[tuple[str, np.ndarray]]:
    """(msgen parameter path, array) for every parameter (or those in `paths`), from
    Hugging Face tensors fetched one at a time by `get(name)`."""
    for b in _owned(m):
        if paths is None or b.path in paths:
            yield b.path, b.weight.map.to_msgen(m, [get(name) for name in b.hf])


def _digest(array: np.ndarray) -> bytes:
    """The bytes of an fp32 array in logical order, hashed a block of rows at a time (a
    transposed view is never copied whole)."""
    h = hashlib.blake2b(str(array.shape).encode())
    rows = max(1, (64 << 20) // max(1, array[:1].nbytes))
    for start in range(0, max(1, len(array)), rows):
        h.update(np.ascontiguousarray(array[start : start + rows], np.float32).tobytes())
    return h.digest()


def check_copies(m: HfModel, get: Get) -> int:
    """Each tied copy is bit for bit the tensor(s) its parameter is made of, compared
    through the copy's map one tensor at a time (a copy and its original are never in
    memory together); the number of copies checked. A copy that differs is refused
    (CopyError naming both): msgen holds the parameter once and would lose it."""
    own = {b.path: b for b in _owned(m)}
    originals: dict[str, bytes] = {}  # by parameter: every MTP layer copies the same two
    checked = 0
    for b in bound(m):
        if not b.weight.tied:
            continue
        source = own[b.path]
        if b.path not in originals:
            arrays = [get(n) for n in source.hf]
            originals[b.path] = _digest(source.weight.map.to_msgen(m, arrays))
        copy = _digest(b.weight.map.to_msgen(m, [get(n) for n in b.hf]))
        if copy != originals[b.path]:
            raise CopyError(
                f"{printable(b.hf[0])} is not a copy of {printable(source.hf[0])}: msgen "
                f"ties them into one parameter, {b.path} (DeepSeek-V3's multi-token "
                "prediction layer shares the main model's embedding and output layer), "
                "and would drop the copy's values"
            )
        checked += 1
    return checked


def to_hf(m: HfModel, get: Get) -> Iterator[tuple[str, np.ndarray]]:
    """(Hugging Face name, array) for every tensor, from msgen parameters fetched one
    at a time by `get(path)`: the inverse of to_msgen."""
    for b in bound(m):  # a tied copy written from the parameter it copies
        arrays = b.weight.map.to_hf(m, get(b.path))
        yield from zip(b.hf, arrays, strict=True)
