"""The attention op's numbers, computed once (`AttentionGeometry`): its heads and kv
heads, their size, the query heads sharing each kv head, the fused qkv's width, and
how the heads lie over the mesh (the axes splitting batch and heads, the heads and kv
heads each rank holds). msgen/ops/attention.py's shape, layout, strategies, saves,
work and settings read this one value.
"""

from __future__ import annotations

from dataclasses import dataclass

from msgen.ops.base import Split, split_factor


def head_dim(node, ctx) -> int:
    """The model's `head_dim` when it defines one, else hidden / heads."""
    if "head_dim" in ctx.dims:
        return ctx.dims["head_dim"]
    return ctx.dims.get("hidden", 0) // node.args["heads"]


def kv_heads(node) -> int:
    """`kv_heads` when written (grouped-query attention), else one per query head."""
    return node.args.get("kv_heads") or node.args["heads"]


@dataclass(frozen=True)
class HeadSplit:
    """How an attention core's per-head tensors [batch, heads, seq, ...] lie over the
    mesh: batch over `batch_axes`, the heads over `head_axes` (whole heads, whole kv
    groups), the sequence whole. attention and mla share it."""

    batch_axes: tuple[str, ...] = ()
    head_axes: tuple[str, ...] = ()
    batch_ways: int = 1  # the slices of batch: the product of `batch_axes`' sizes
    head_ways: int = 1  # the slices of the heads: the product of `head_axes`' sizes

    @property
    def scores(self) -> Split:
        """The split of the scores, the probabilities, the kernel's statistics, q, k, v."""
        return (self.batch_axes, self.head_axes, (), ())

    @property
    def strategy(self) -> tuple[int, int, int, int]:
        """Their BNSD strategy entry: batch and heads sliced, seq and head size whole."""
        return (self.batch_ways, self.head_ways, 1, 1)

    @classmethod
    def of(cls, split: Split, ctx) -> HeadSplit:
        """From a [batch, seq, heads * size] split: batch's axes and the last dim's."""
        batch_axes, head_axes = split[0], split[-1]
        return cls(
            batch_axes,
            head_axes,
            split_factor(batch_axes, ctx),
            split_factor(head_axes, ctx),
        )


@dataclass(frozen=True)
class AttentionGeometry:
    """One attention op over qkv [batch, seq, (heads + 2 * kv_heads) * head_dim], laid
    out per kv group (its query heads, then its k, then its v), at the split qkv has
    inside the op (`split`: batch over its axes, whole groups over the heads', the
    sequence whole)."""

    heads: int
    kv_heads: int
    head_dim: int
    split: HeadSplit = HeadSplit()

    @property
    def group(self) -> int:
        """The query heads sharing one kv head."""
        return self.heads // self.kv_heads

    @property
    def qkv_width(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    @property
    def out_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def heads_per_rank(self) -> int:
        return self.heads // self.split.head_ways

    @property
    def kv_heads_per_rank(self) -> int:
        return self.kv_heads // self.split.head_ways

    @classmethod
    def of(cls, node, ctx, qkv_split: Split | None = None) -> AttentionGeometry:
        """`qkv_split`: the split qkv has inside the op (its layout's input), if known."""
        split = HeadSplit() if qkv_split is None else HeadSplit.of(qkv_split, ctx)
        return cls(node.args["heads"], kv_heads(node), head_dim(node, ctx), split)
