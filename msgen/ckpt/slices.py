"""The slice of a logical tensor each rank holds, read from a strategy file's layout.

A layout is MindSpore's JSON form (parallel/_parallel_serialization.py, as
msgen.emit.strategy writes it and AutoParallel.save_param_strategy_file does):
`dev_matrix` is the stage's devices as a matrix, its ranks numbered row-major over it;
`tensor_map[d]` names the device dim that splits tensor dim d, counted from the right
(-1: not split). With the parallel optimizer, the ranks holding the same slice (those
differing only along the device dims no tensor dim maps to) further split dim 0 in
groups of `opt_weight_shard_size` (-1: all of them), a rank taking the chunk of its
place in its group in rank order (operator_info.cc, CreateGroupForOptShard; its
`opt_weight_shard_step` is no stride when the group is not evenly spaced, so it is
not read here: MindSpore's own reader goes by the device matrix too,
parallel/_tensor.py _construct_tensor_layout_helper).

Pure numpy; MindSpore's transform_checkpoints is what the tests hold these against.
"""

from __future__ import annotations

from math import prod

import numpy as np


class LayoutError(ValueError):
    """A layout these functions do not read (a dim split over several device dims)."""


def _cuts(shape, layout: dict, local_rank: int) -> list[tuple[int, int, int]]:
    """(dim, parts, index) of each cut, in the order they apply."""
    matrix = layout["dev_matrix"]
    if len(layout["tensor_map"]) != len(shape):
        raise LayoutError(
            f"its tensor_map has {len(layout['tensor_map'])} dims, the tensor {len(shape)}"
        )
    split = [m for m in layout["tensor_map"] if isinstance(m, int) and m >= 0]
    if len(set(split)) != len(split):
        raise LayoutError("its tensor_map splits two dims over one device dim")
    coords = np.unravel_index(local_rank, matrix)
    cuts = []
    for dim, mapped in enumerate(layout["tensor_map"]):
        if not isinstance(mapped, int):
            raise LayoutError(f"dim {dim} is split over several device dims ({mapped})")
        if mapped >= 0:
            axis = len(matrix) - 1 - mapped
            cuts.append((dim, matrix[axis], int(coords[axis])))
    size = layout.get("opt_weight_shard_size", 0)
    if size != 0:
        used = {len(matrix) - 1 - m for m in layout["tensor_map"] if m >= 0}
        repeated = [axis for axis in range(len(matrix)) if axis not in used]
        place = 0  # the rank's place, in rank order, among the ranks holding its slice
        for axis in repeated:
            place = place * matrix[axis] + int(coords[axis])
        if size == -1:
            size = prod(matrix[axis] for axis in repeated)
        cuts.append((0, size, place % size))
    return cuts


def slice_shape(shape, layout: dict) -> tuple[int, ...]:
    """The shape every rank's slice of a tensor of `shape` has."""
    out = list(shape)
    for dim, parts, _ in _cuts(shape, layout, 0):
        if out[dim] % parts:
            raise LayoutError(f"dim {dim} of {list(shape)} does not split {parts} ways")
        out[dim] //= parts
    return tuple(out)


def slice_of(array: np.ndarray, layout: dict, local_rank: int) -> np.ndarray:
    """The part of `array` the rank `local_rank` of its stage holds (a view)."""
    slice_shape(array.shape, layout)  # divisible, or a LayoutError
    for dim, parts, index in _cuts(array.shape, layout, local_rank):
        size = array.shape[dim] // parts
        where = [slice(None)] * array.ndim
        where[dim] = slice(index * size, (index + 1) * size)
        array = array[tuple(where)]
    return array
