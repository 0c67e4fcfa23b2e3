"""The moe op's numbers, computed once (`MoeGeometry`): tokens, GShard's groups, each
expert's slots (its capacity), the rows the experts compute over, the stage's devices
as the generated cell's Layouts lay them and the experts each expert-parallel rank
holds. msgen/ops/moe.py's layout, msgen/ops/moe_costs.py's saves and work (which the
estimate reads) and the generated cell's settings all read this one value; no other
module computes a slot count.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil, prod

from msgen.ir.mesh import RankMesh
from msgen.ops.moe_rows import expert_ffn_axes


@dataclass(frozen=True)
class MoeGeometry:
    """One moe op over an input of logical shape [..., hidden] on a mesh of `ctx`."""

    tokens: int  # the input's leading dims folded: the tokens the router scores
    hidden: int
    experts: int
    top_k: int
    ffn: int
    capacity: float | None  # the capacity factor; None: dropless
    imbalance: float  # dropless: the busiest expert rank's load over the mean
    groups: int  # GShard's groups with a capacity (one per dp rank), else 1
    group_tokens: int  # the tokens of one group
    slots: int | None  # each expert's slots in a group (its capacity); None: dropless
    copies: int  # the token copies the experts compute: routed (dropless) or padded slots
    loaded: float  # the busiest rank's share of `copies` in rows: copies x imbalance dropless
    devices: tuple[int, int, int]  # [dp / ep, ep, tp], the Layouts' device matrix
    experts_per_rank: int  # the stacked experts an ep rank holds: experts / ep
    # tp when it has more than one rank: the axes the shared experts' ffn dim, and the
    # dense partial sums and the dropless region's token shares, lie over
    tp_axes: tuple[str, ...]
    expert_ffn_axes: tuple[str, ...]  # the stacked experts' ffn dim's (moe_rows)

    @property
    def dropless(self) -> bool:
        return self.capacity is None

    @property
    def rows(self) -> int:
        """The busiest rank's rows as whole rows: the buffers' and the exchanges' size."""
        return ceil(self.loaded)

    @property
    def moved(self) -> int:
        """Elements each AllToAll (dispatch, combine) carries: the rows of hidden."""
        return self.rows * self.hidden

    @classmethod
    def of(cls, node, x_shape: tuple[int, ...], ctx) -> MoeGeometry:
        a = node.args
        capacity = a.get("capacity")
        sizes = ctx.mesh_sizes
        dp, ep = sizes.get("dp", 1), sizes.get("ep", 1)
        n, e, k = prod(x_shape[:-1]), a["experts"], a["top_k"]
        imbalance = float(a.get("imbalance", 1.0))
        if capacity is None:
            groups, slots, copies = 1, None, n * k
            loaded = copies * imbalance
        else:
            groups = dp
            slots = capacity_slots(n // groups, k, e, capacity)
            copies = groups * e * slots
            loaded = copies
        return cls(
            tokens=n,
            hidden=x_shape[-1],
            experts=e,
            top_k=k,
            ffn=a["ffn"],
            capacity=capacity,
            imbalance=imbalance,
            groups=groups,
            group_tokens=n // groups,
            slots=slots,
            copies=copies,
            loaded=loaded,
            devices=devices(ctx),
            experts_per_rank=e // ep,
            tp_axes=("tp",) if sizes.get("tp", 1) > 1 else (),
            expert_ffn_axes=expert_ffn_axes(node, ctx),
        )


def capacity_slots(group_tokens: int, top_k: int, experts: int, factor: float) -> int:
    """Each expert's slots in a group of `group_tokens`: ceil(group tokens * top_k /
    experts * factor) (GShard's expert capacity; Megatron-LM's `get_capacity`), never
    more than the group's tokens, a token choosing an expert once. mindformers 2.0.0
    caps it the same way (mindformers/modules/transformer/moe.py
    `calculate_expert_capacity_v2`: `if tokens_per_group < raw_capacity: raw_capacity =
    tokens_per_group`). The generated cell computes the same from its tensors' shapes
    (templates/ops/moe_capacity.py.j2 `MoE.slots`; tests/test_moe_geometry.py holds the
    two equal)."""
    return min(group_tokens, ceil(group_tokens * top_k / experts * factor))


def devices(ctx) -> tuple[int, int, int]:
    """A stage's devices as the generated moe cell's Layouts lay them, [dp / ep, ep, tp]:
    Megatron-LM's order (tp innermost, then ep), the ranks msgen/ir/mesh.py
    numbers, a MindSpore Layout's last device dim varying fastest
    (mindspore/parallel/shard.py `Layout`: its rank_list is the row-major range). The
    mesh's owner computes it (`RankMesh.dev_matrix`)."""
    edp, ep, tp = RankMesh.of_sizes(ctx.mesh_sizes).dev_matrix(expert=True)
    return edp, ep, tp
