"""The layer kinds an imported spec defines and the runs of layers each repeat covers:
one kind when every layer is alike (`decoder`), else a kind per sort of layer
(full attention or a sliding window, the dense MLP or experts), in runs of consecutive
layers of one sort, as the network repeats them in order. MSL repeats a layer kind
once (MSL121), so a sort that comes back after another gets a kind of its own
(`decoder_2`, ...). One home for the spec's text (msgen.hf.spec) and the weights'
paths (msgen.hf.layout).
"""

from __future__ import annotations

from dataclasses import dataclass

from msgen.hf.model import HfModel


@dataclass(frozen=True)
class Run:
    kind: str  # the layer kind's name
    start: int  # its first Hugging Face layer
    count: int
    window: bool  # its attention has the sliding window
    sparse: bool  # its feed-forward is the experts


def _sort(m: HfModel, i: int) -> tuple[bool, bool]:
    window = m.window is not None and m.window_from <= i
    return window, m.sparse(i)


def runs(m: HfModel) -> tuple[Run, ...]:
    """The runs in network order."""
    sorts = [_sort(m, i) for i in range(m.layers)]
    if len(set(sorts)) == 1:
        return (Run("decoder", 0, m.layers, *sorts[0]),)
    found: list[Run] = []
    seen: dict[str, int] = {}
    start = 0
    for i in range(1, m.layers + 1):
        if i < m.layers and sorts[i] == sorts[start]:
            continue
        window, sparse = sorts[start]
        base = "decoder" + ("_moe" if sparse else "") + ("_swa" if window else "")
        seen[base] = seen.get(base, 0) + 1
        kind = base if seen[base] == 1 else f"{base}_{seen[base]}"
        found.append(Run(kind, start, i - start, window, sparse))
        start = i
    return tuple(found)


def layer_path(m: HfModel, i: int, found: tuple[Run, ...] | None = None) -> str:
    """msgen's path of Hugging Face layer i: `KIND.COPY` of the run holding it."""
    for run in found or runs(m):
        if run.start <= i < run.start + run.count:
            return f"{run.kind}.{i - run.start}"
    raise IndexError(i)
