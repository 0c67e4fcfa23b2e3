"""What a spec needs of a Hugging Face decoder, in msgen's terms (`HfModel`), and the
parameter count transformers builds from it. msgen.hf.config reads it from a
`config.json`; the spec writer, the weight mapping and the checkpoint tools read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from msgen.hf.deepseek import HfMla
from msgen.hf.experts import HfMoe, moe_params


@dataclass(frozen=True)
class HfModel:
    """What a spec needs of a Hugging Face decoder, in msgen's terms."""

    family: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    eps: float
    tied: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    rope_theta: float
    max_positions: int | None
    window: int | None
    window_from: int  # the first layer with the sliding window (layers: none has it)
    dtype: str
    param_dtype: str
    notes: tuple[str, ...] = field(default=())
    # RoPE scaling: its rope_type and parameters (msgen.ops.rope_scaling), None for plain
    rope_scaling: tuple[str, tuple[tuple[str, float | bool], ...]] | None = None
    qk_norm: bool = False  # Qwen3's RMSNorm of each head of q and k
    moe: HfMoe | None = None  # the experts, and which layers have them
    mla: HfMla | None = None  # DeepSeek's latent attention (msgen.hf.deepseek)
    mtp: int = 0  # DeepSeek-V3's multi-token prediction layers (num_nextn_predict_layers)

    @property
    def untied(self) -> bool:
        return not self.tied

    @property
    def q_rows(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_rows(self) -> int:
        return self.kv_heads * self.head_dim

    def sparse(self, layer: int) -> bool:
        """Whether Hugging Face layer `layer` has experts (else the dense MLP)."""
        return self.moe is not None and self.moe.sparse[layer]

    @property
    def q_lora(self) -> bool:
        return self.mla is not None and self.mla.q_lora_rank is not None

    @property
    def q_full(self) -> bool:
        return self.mla is not None and self.mla.q_lora_rank is None

    @property
    def expert_bias(self) -> bool:
        return self.moe is not None and getattr(self.moe.routing, "expert_bias", False)

    @property
    def head_dim_is_derived(self) -> bool:
        return self.head_dim * self.heads == self.hidden

    @property
    def params(self) -> int:
        """The model's parameter count as transformers builds it: embeddings, per layer
        q/k/v/o (+ biases), the MLP's gate/up/down (+ biases) and two RMSNorm weights,
        the final norm, and the output layer unless tied."""
        q, kv = self.q_rows, self.kv_rows
        attention = self.hidden * (q + 2 * kv) + q * self.hidden
        attention += (q + 2 * kv) * self.qkv_bias + self.hidden * self.o_bias
        attention += 2 * self.head_dim * self.qk_norm
        if self.mla is not None:
            attention = self.mla.params(self.hidden, self.heads)
        mlp = 3 * self.hidden * self.ffn + (2 * self.ffn + self.hidden) * self.mlp_bias
        sparse = sum(self.sparse(i) for i in range(self.layers))
        layers = self.layers * (attention + 2 * self.hidden) + (self.layers - sparse) * mlp
        if self.moe is not None:
            layers += sparse * moe_params(self.moe, self.hidden)
        head = 0 if self.tied else self.vocab * self.hidden
        return self.vocab * self.hidden + layers + self.hidden + head
