"""The moe op's row counts and splits: how many token copies its experts compute over
(the routed copies dropless, the padded slots with a capacity), GShard's groups, and
how the experts and the dropless Morph region lie over the mesh. One home for what
msgen/ops/moe.py's layout, saves and work and the generated cell's settings share."""

from __future__ import annotations

from math import ceil, prod


def tokens(node, x_shape) -> int:
    return prod(x_shape[:-1])


def groups(ctx) -> int:
    """GShard's groups of a capacity: one per data-parallel rank (dp = ep x dp / ep),
    each filling its experts' slots from its own tokens, as Megatron-LM's ranks do."""
    return ctx.mesh_sizes.get("dp", 1)


def slots(node, group_tokens: int) -> int:
    """Each expert's slots in a group: ceil(group tokens * top_k / experts * factor)
    (Megatron-LM's `get_capacity`), never more than the group's tokens (a token
    chooses an expert once); the generated cell computes the same
    (templates/ops/moe_capacity.py.j2 `MoE.slots`)."""
    e, k = node.args["experts"], node.args["top_k"]
    return min(group_tokens, ceil(group_tokens * k / e * node.args["capacity"]))


def expert_rows(node, n_tokens: int, ctx) -> int:
    """Rows the experts compute over, all experts together: the token copies
    (tokens * top_k, dropless) or, with a capacity factor, every expert padded to its
    slots in every group (the static shape graph mode compiles)."""
    if node.args.get("capacity") is None:
        return n_tokens * node.args["top_k"]
    g = groups(ctx)
    return g * node.args["experts"] * slots(node, n_tokens // g)


def devices(ctx) -> tuple[int, int, int]:
    """A stage's devices as the dropless Morph region lays them, [ep, dp / ep, tp]
    (templates/ops/moe_permute.py.j2 `region`)."""
    sizes = ctx.mesh_sizes
    ep = sizes.get("ep", 1)
    return ep, sizes.get("dp", 1) // ep, sizes.get("tp", 1)


def expert_ffn_axes(node, ctx) -> tuple[str, ...]:
    """The axes the experts' ffn dim is split over: tp with a capacity (expert tensor
    parallelism = tp, Megatron-LM's default); none dropless, where the Morph region
    keeps each expert whole and gives each tp rank tokens of its own instead, as
    mindformers 2.0.0's grouped-matmul path does (transformer/moe/ffn.py: the weights
    laid (ep, None), the tokens over dp * tp)."""
    if node.args.get("capacity") is None or ctx.mesh_sizes.get("tp", 1) == 1:
        return ()
    return ("tp",)


def imbalance(node) -> float:
    return float(node.args.get("imbalance", 1.0))
