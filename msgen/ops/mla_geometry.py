"""The mla op's numbers, computed once (`MlaGeometry`): its heads and their parts (the
q/k head size as its no-rope and rope parts, v's), the LoRA ranks, the projections'
widths, the head size the flash kernel runs at, and how the heads lie over the mesh.
msgen/ops/mla.py's shape, parameters, layout, collectives, saves, work and settings
read this one value.
"""

from __future__ import annotations

from dataclasses import dataclass

from msgen.ops.attention_geometry import HeadSplit
from msgen.ops.base import Split


@dataclass(frozen=True)
class MlaGeometry:
    """One mla op; its heads lie over the axes splitting its output's last dim (tp)."""

    heads: int
    nope: int  # qk_nope_head_dim
    rope: int  # qk_rope_head_dim: the rotated part, one key shared by every head
    v: int  # v_head_dim
    kv: int  # kv_lora_rank
    q: int  # q_lora_rank, 0 without q LoRA
    flash: bool
    split: HeadSplit = HeadSplit()  # the core's [batch, heads, seq, ...] tensors'

    @property
    def qk(self) -> int:
        """The q/k head size: its no-rope and rope parts."""
        return self.nope + self.rope

    @property
    def v_core(self) -> int:
        """v's head size in the attention core: padded to q/k's under flash (the
        kernel's one head size D), else its own."""
        return self.qk if self.flash else self.v

    @property
    def q_width(self) -> int:
        """q's projection output, per-head columns: heads x (nope + rope)."""
        return self.heads * self.qk

    @property
    def kv_a_width(self) -> int:
        """The fused down-projection's output: the kv latent and the shared rope key."""
        return self.kv + self.rope

    @property
    def kv_b_width(self) -> int:
        """kv_b's output, per-head columns: heads x (k's no-rope part + v)."""
        return self.heads * (self.nope + self.v)

    @property
    def out_width(self) -> int:
        return self.heads * self.v

    @property
    def heads_per_rank(self) -> int:
        return self.heads // self.split.head_ways

    @classmethod
    def of(cls, node, ctx=None, out_split: Split | None = None) -> MlaGeometry:
        """`out_split`: the op's output split (its last dim's axes split the heads), if
        known."""
        a = node.args
        return cls(
            heads=a["heads"],
            nope=a["qk_nope_head_dim"],
            rope=a["qk_rope_head_dim"],
            v=a["v_head_dim"],
            kv=a["kv_lora_rank"],
            q=a.get("q_lora_rank") or 0,
            flash=bool(a.get("flash")),
            split=HeadSplit() if out_split is None else HeadSplit.of(out_split, ctx),
        )
