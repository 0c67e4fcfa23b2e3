"""The moe op's splits: how the experts and the dropless Morph region lie over the mesh,
one home for what msgen/ops/moe.py's layout and strategies and msgen/ops/moe_costs.py
share, and the MSL210 refusal of a declared expert split other than the code's. Its
numbers (tokens, groups, slots, rows) are msgen/ops/moe_geometry.py's."""

from __future__ import annotations

from msgen.ops.base import OpError


def expert_ffn_axes(node, ctx) -> tuple[str, ...]:
    """The axes the experts' ffn dim is split over: tp with a capacity (expert tensor
    parallelism = tp, Megatron-LM's default); none dropless, where the Morph region
    keeps each expert whole and gives each tp rank tokens of its own instead, as
    mindformers 2.0.0's grouped-matmul path does (transformer/moe/ffn.py: the weights
    laid (ep, None), the tokens over dp * tp)."""
    if node.args.get("capacity") is None or ctx.mesh_sizes.get("tp", 1) == 1:
        return ()
    return ("tp",)


def expert_split(node, ctx, name: str) -> tuple[tuple[str, ...], ...]:
    """The split the generated code gives the stacked expert matrix `name` (gate, up
    [experts, hidden, ffn], down [experts, ffn, hidden]): the experts over ep, the ffn
    dim over `expert_ffn_axes`. With a capacity the experts' batched matmuls take it as
    their weights' layouts (msgen/ops/moe.py `strategies`); dropless the Morph
    region lays the weights so, (ep, None, None) (templates/ops/moe_permute.py.j2
    `region`).
    A spec declaring another split is refused (MSL210): the estimate, plan.json and the
    strategy file would describe slices the ranks do not hold."""
    ep = ("ep",) if ctx.mesh_sizes.get("ep", 1) > 1 else ()
    ffn = expert_ffn_axes(node, ctx)
    return (ep, ffn, ()) if name == "down" else (ep, (), ffn)


def named(split) -> tuple[str, ...]:
    """A split as a Layout's tensor map: the axis of each dim, or "None" (whole)."""
    return tuple(axes[0] if axes else "None" for axes in split)


def maps_source(maps) -> str:
    """Tensor maps as Python source, in black's quotes."""
    inner = ("(" + ", ".join(f'"{n}"' for n in m) + ")" for m in maps)
    return "(" + ", ".join(inner) + ")"


def effective(split, ctx) -> tuple[tuple[str, ...], ...]:
    """`split` without the axes of size 1, which split nothing (as `expert_split`
    writes its own): `[ep, 1, tp]` with tp = 1 is `[ep, 1, 1]`."""
    return tuple(tuple(a for a in axes if ctx.mesh_sizes.get(a, 1) > 1) for axes in split)


def split_error(node, name: str, split, code_split, dropless: bool) -> OpError:
    """A declared split of a stacked expert matrix other than `expert_split`, the one
    the generated code runs."""

    def show(sp) -> str:
        return "[" + ", ".join("*".join(axes) or "1" for axes in sp) + "]"

    why = (
        "its experts over ep and each expert whole, the permuting dispatcher giving each "
        "tp rank tokens of its own instead"
        if dropless
        else "its experts over ep and its ffn dim over tp"
    )
    hint = f"write `{name} @ {show(code_split)}`, or drop the split"
    return OpError(
        "MSL210",
        f"`{name}` of {'dropless ' * dropless}moe `{node.name}` is split {show(split)}, but "
        f"the generated code splits it {show(code_split)}: {why}",
        name,
        hint + (" (with a capacity, its ffn dim splits over tp)" if dropless else ""),
    )
