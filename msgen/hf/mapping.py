"""What one weight of the mapping table is: its Hugging Face tensor(s), its msgen
parameter, and the one `Map` that owns both directions between them (as
Megatron-Bridge's `MegatronParamMapping`s do: `hf_to_megatron` and `megatron_to_hf` on
one object). A family's table (msgen.hf.families) is a list of these; a new family is
a new table.

Hugging Face keeps `nn.Linear` weights as [out, in]; msgen's linear weight is
[in, out] (x @ weight): the transposing maps. q, k and v are three projections there
and one `qkv` here, laid out per kv group (its query heads, then its k head, then its
v head), the order repeat_kv pairs them in: query head h uses kv head
h // (heads / kv_heads). Both rotate half for RoPE, so no permutation of q or k.
Experts are one module each there and one stacked tensor here, [experts, in, out].
A tied copy is a tensor the checkpoint holds twice under two names (DeepSeek-V3's
multi-token prediction layer keeps copies of the embedding and the output layer):
msgen holds one parameter, the row's `path`, checked equal to the copy on import and
written out as the copy on export.
Dtypes are not the map's: every map moves fp32 arrays, and the checkpoint writers
give each tensor back its source dtype (msgen.hf.ckpt, source.json).

All maps are pure: arrays in, arrays out, one parameter at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from msgen.hf.model import HfModel

# the dims a table names that are not HfModel attributes
_DIMS = {
    "experts": lambda m: m.moe.experts,
    "moe_ffn": lambda m: m.moe.ffn,
    "shared_ffn": lambda m: m.moe.shared_ffn,
    "one": lambda m: 1,
    # DeepSeek's latent attention (msgen.hf.deepseek.HfMla)
    "q_lora_rank": lambda m: m.mla.q_lora_rank,
    "kv_lora_rank": lambda m: m.mla.kv_lora_rank,
    "q_out": lambda m: m.heads * m.mla.qk,
    "kv_a_out": lambda m: m.mla.kv_lora_rank + m.mla.rope,
    "kv_b_out": lambda m: m.heads * (m.mla.nope + m.mla.v),
    "o_in": lambda m: m.heads * m.mla.v,
    # a multi-token prediction module's eh_proj reads [embedding; hidden state]
    "eh_in": lambda m: 2 * m.hidden,
}


def dim(m: HfModel, name: str) -> int:
    return _DIMS[name](m) if name in _DIMS else getattr(m, name)


class Map:
    """Both directions of one weight, and its msgen shape from the Hugging Face ones."""

    def to_msgen(self, m: HfModel, arrays: list[np.ndarray]) -> np.ndarray:
        raise NotImplementedError

    def to_hf(self, m: HfModel, array: np.ndarray) -> list[np.ndarray]:
        raise NotImplementedError

    def shape(self, m: HfModel, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
        raise NotImplementedError


class Copy(Map):
    """The same tensor on both sides (norms, the embedding table)."""

    def to_msgen(self, m, arrays):
        return arrays[0]

    def to_hf(self, m, array):
        return [array]

    def shape(self, m, shapes):
        return shapes[0]


class Transpose(Map):
    """An nn.Linear weight [out, in] as msgen's [in, out]."""

    def to_msgen(self, m, arrays):
        return arrays[0].T

    def to_hf(self, m, array):
        return [array.T]

    def shape(self, m, shapes):
        return shapes[0][::-1]


def group_order(m: HfModel) -> np.ndarray:
    """Row indices of [q; k; v] (Hugging Face's three projections stacked) in msgen's
    per-kv-group order."""
    d, r = m.head_dim, m.heads // m.kv_heads
    q_rows, k_rows = m.q_rows, m.kv_rows
    order = []
    for j in range(m.kv_heads):
        order.extend(range(j * r * d, (j + 1) * r * d))  # the group's query heads
        order.extend(range(q_rows + j * d, q_rows + (j + 1) * d))  # its k
        order.extend(range(q_rows + k_rows + j * d, q_rows + k_rows + (j + 1) * d))  # its v
    return np.asarray(order)


@dataclass(frozen=True)
class FusedQkv(Map):
    """q, k and v (weights [rows, hidden], or biases [rows]) fused into one qkv in
    per-kv-group order, a weight transposed to [hidden, rows]; split back at the
    projections' bounds."""

    weight: bool

    def to_msgen(self, m, arrays):
        fused = np.concatenate(arrays)[group_order(m)]
        return fused.T if self.weight else fused

    def to_hf(self, m, array):
        stacked = (array.T if self.weight else array)[np.argsort(group_order(m))]
        bounds = np.cumsum([m.q_rows, m.kv_rows])
        return np.split(stacked, bounds)

    def shape(self, m, shapes):
        rows = sum(s[0] for s in shapes)
        return (shapes[0][1], rows) if self.weight else (rows,)


class StackedExperts(Map):
    """Each expert's nn.Linear weight [out, in], one tensor per expert there, stacked
    as msgen's experts hold them: [experts, in, out]."""

    def to_msgen(self, m, arrays):
        return np.stack([a.T for a in arrays])

    def to_hf(self, m, array):
        return [e.T for e in array]

    def shape(self, m, shapes):
        return (len(shapes), *shapes[0][::-1])


COPY, TRANSPOSE, STACKED = Copy(), Transpose(), StackedExperts()
QKV_WEIGHT, QKV_BIAS = FusedQkv(weight=True), FusedQkv(weight=False)


@dataclass(frozen=True)
class Weight:
    """One row of a family's table: the Hugging Face tensor names under the layer's
    prefix (`{e}` runs over the experts), the msgen parameter under the layer's path,
    the map between them, each Hugging Face tensor's shape as dims (HfModel's, or
    `experts`, `moe_ffn`), and the HfModel flag that says the weight exists. A tied
    row (`tied`) is a copy: its `path` is a parameter of the model's own (not under
    the layer's path) that the Hugging Face tensor equals through `map`."""

    hf: tuple[str, ...]
    path: str
    map: Map
    shapes: tuple[tuple[str, ...], ...]
    when: str | None = None
    tied: bool = False

    def present(self, m: HfModel) -> bool:
        return self.when is None or bool(getattr(m, self.when))

    def names(self, m: HfModel, prefix: str) -> tuple[str, ...]:
        if any("{e}" in name for name in self.hf):
            count = dim(m, "experts")
            return tuple(prefix + n.format(e=e) for n in self.hf for e in range(count))
        return tuple(prefix + n for n in self.hf)

    def hf_shapes(self, m: HfModel) -> tuple[tuple[int, ...], ...]:
        """Each name's shape, in `names` order."""
        per = [tuple(dim(m, d) for d in shape) for shape in self.shapes]
        if any("{e}" in name for name in self.hf):
            return tuple(s for s in per for _ in range(dim(m, "experts")))
        return tuple(per)


def linear(hf: str, path: str, out: str, into: str, when_bias: str | None = None) -> tuple:
    """An nn.Linear module's rows: its weight transposed, and its bias where the flag
    `when_bias` says the model has one."""
    rows = (Weight((f"{hf}.weight",), f"{path}.weight", TRANSPOSE, ((out, into),)),)
    if when_bias is not None:
        rows += (Weight((f"{hf}.bias",), f"{path}.bias", COPY, ((out,),), when_bias),)
    return rows


def experts(names: tuple[str, str, str], path: str) -> tuple[Weight, ...]:
    """The stacked experts' gate, up and down from each expert's three projections
    (`names`, each with `{e}` for the expert), as msgen's moe op `path` holds them."""
    gate, up, down = names
    return (
        Weight((gate,), f"{path}.gate", STACKED, (("moe_ffn", "hidden"),)),
        Weight((up,), f"{path}.up", STACKED, (("moe_ffn", "hidden"),)),
        Weight((down,), f"{path}.down", STACKED, (("hidden", "moe_ffn"),)),
    )


def tied_copy(hf: str, path: str, map: Map, shape: tuple[str, ...], when: str | None = None):
    """A row for a Hugging Face tensor that is a copy of the model's parameter `path`
    (msgen.hf.layout checks the copy on import and writes it on export)."""
    return Weight((hf,), path, map, (shape,), when, tied=True)
