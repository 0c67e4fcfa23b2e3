"""The mapping tables: per Hugging Face family, every weight's Hugging Face name(s),
msgen path and map (msgen.hf.mapping). A layer's rows are its attention's, then its
dense MLP's or, in a sparse layer, its experts'. The names are those of transformers
4.57's modelling files (`modeling_llama.py`, `modeling_qwen2.py`, `modeling_qwen3.py`,
`modeling_mistral.py`, `modeling_mixtral.py`, `modeling_qwen2_moe.py`,
`modeling_qwen3_moe.py`, `modeling_deepseek_v2.py`, `modeling_deepseek_v3.py`); the msgen
paths are those of the ops msgen.hf.spec writes (n1, qkv, att, o, n2, gate, up,
down; `moe` in a sparse layer). A tied model has no `lm_head.weight` and msgen's
output layer uses `emb.table`.
"""

from __future__ import annotations

from dataclasses import dataclass

from msgen.hf.mapping import (
    COPY,
    QKV_BIAS,
    QKV_WEIGHT,
    TRANSPOSE,
    Weight,
    experts,
    linear,
    tied_copy,
)


@dataclass(frozen=True)
class Family:
    attention: tuple[Weight, ...]  # every layer's: norms, attention
    dense: tuple[Weight, ...]  # a dense layer's MLP
    sparse: tuple[Weight, ...] = ()  # a sparse layer's router and experts
    # a multi-token prediction layer's own rows and tied copies beside its block, whose
    # rows are a main layer's (msgen.hf.layout)
    mtp: tuple[Weight, ...] = ()


# the model's own, outside the layers
TABLE, OUTPUT = "emb.table", "logits.weight"  # the embedding's and the output layer's
EMBEDDING = (Weight(("model.embed_tokens.weight",), TABLE, COPY, (("vocab", "hidden"),)),)
HEAD = (
    Weight(("model.norm.weight",), "norm.gamma", COPY, (("hidden",),)),
    Weight(("lm_head.weight",), OUTPUT, TRANSPOSE, (("vocab", "hidden"),), "untied"),
)

_QKV = tuple(f"self_attn.{p}_proj" for p in "qkv")
ATTENTION = (
    Weight(("input_layernorm.weight",), "n1.gamma", COPY, (("hidden",),)),
    Weight(("post_attention_layernorm.weight",), "n2.gamma", COPY, (("hidden",),)),
    Weight(
        tuple(f"{p}.weight" for p in _QKV),
        "qkv.weight",
        QKV_WEIGHT,
        (("q_rows", "hidden"), ("kv_rows", "hidden"), ("kv_rows", "hidden")),
    ),
    Weight(
        tuple(f"{p}.bias" for p in _QKV),
        "qkv.bias",
        QKV_BIAS,
        (("q_rows",), ("kv_rows",), ("kv_rows",)),
        "qkv_bias",
    ),
    *linear("self_attn.o_proj", "o", "hidden", "q_rows", "o_bias"),
)
# Qwen3's: an RMSNorm of each head of q and k (Qwen3Attention q_norm, k_norm)
QK_NORMS = (
    Weight(("self_attn.q_norm.weight",), "att.q_norm", COPY, (("head_dim",),)),
    Weight(("self_attn.k_norm.weight",), "att.k_norm", COPY, (("head_dim",),)),
)
MLP = (
    *linear("mlp.gate_proj", "gate", "ffn", "hidden", "mlp_bias"),
    *linear("mlp.up_proj", "up", "ffn", "hidden", "mlp_bias"),
    *linear("mlp.down_proj", "down", "hidden", "ffn", "mlp_bias"),
)


def _router(name: str) -> Weight:
    """The router, nn.Linear(hidden, experts) there: [experts, hidden] -> [hidden, experts]."""
    return Weight((name,), "moe.router", TRANSPOSE, (("experts", "hidden"),))


# MixtralSparseMoeBlock: gate (the router), experts[e].w1 (gate), w3 (up), w2 (down)
MIXTRAL_EXPERTS = (
    _router("block_sparse_moe.gate.weight"),
    *experts(
        tuple(f"block_sparse_moe.experts.{{e}}.{w}.weight" for w in ("w1", "w3", "w2")), "moe"
    ),
)
# Qwen3MoeSparseMoeBlock: gate (the router), experts[e].gate_proj, up_proj, down_proj
QWEN_EXPERTS = (
    _router("mlp.gate.weight"),
    *experts(tuple(f"mlp.experts.{{e}}.{p}_proj.weight" for p in ("gate", "up", "down")), "moe"),
)

# Qwen2MoeSparseMoeBlock: Qwen3-MoE's, and a shared expert (shared_expert.gate_proj,
# up_proj, down_proj) whose output sigmoid(shared_expert_gate(x)) scales
QWEN2_EXPERTS = (
    *QWEN_EXPERTS,
    *(
        Weight((f"mlp.shared_expert.{p}_proj.weight",), f"moe.shared_{p}", TRANSPOSE, (shape,))
        for p, shape in (
            ("gate", ("shared_ffn", "hidden")),
            ("up", ("shared_ffn", "hidden")),
            ("down", ("hidden", "shared_ffn")),
        )
    ),
    Weight(("mlp.shared_expert_gate.weight",), "moe.shared_sigmoid", TRANSPOSE,
           (("one", "hidden"),)),  # fmt: skip
)


# DeepseekV2Attention / DeepseekV3Attention: q_proj, or q_a_proj, q_a_layernorm and
# q_b_proj (q LoRA); kv_a_proj_with_mqa, [kv_lora_rank + qk_rope_head_dim, hidden], the
# latent's rows then the rope key's, as msgen's kv_a holds its columns; kv_a_layernorm;
# kv_b_proj, per head [k_nope | v]; o_proj. All plain nn.Linear, no biases.
def _mla(name: str, path: str, shape: tuple[str, ...], when: str | None = None) -> Weight:
    """One of the latent attention's weights: a norm copied, an nn.Linear transposed."""
    kind = COPY if len(shape) == 1 else TRANSPOSE
    return Weight((f"self_attn.{name}.weight",), f"att.{path}", kind, (shape,), when)


MLA = (
    Weight(("input_layernorm.weight",), "n1.gamma", COPY, (("hidden",),)),
    Weight(("post_attention_layernorm.weight",), "n2.gamma", COPY, (("hidden",),)),
    _mla("q_proj", "q", ("q_out", "hidden"), "q_full"),
    _mla("q_a_proj", "q_a", ("q_lora_rank", "hidden"), "q_lora"),
    _mla("q_a_layernorm", "q_norm", ("q_lora_rank",), "q_lora"),
    _mla("q_b_proj", "q_b", ("q_out", "q_lora_rank"), "q_lora"),
    _mla("kv_a_proj_with_mqa", "kv_a", ("kv_a_out", "hidden")),
    _mla("kv_a_layernorm", "kv_norm", ("kv_lora_rank",)),
    _mla("kv_b_proj", "kv_b", ("kv_b_out", "kv_lora_rank")),
    *linear("self_attn.o_proj", "o", "hidden", "o_in"),
)
# DeepseekV2MoE / DeepseekV3MoE: gate (the router; V3's holds the correction bias, a
# buffer, msgen's moe.expert_bias), experts[e].gate_proj, up_proj, down_proj, and the
# shared experts as one MLP (shared_experts.gate_proj, up_proj, down_proj), ungated
_BIAS = ("mlp.gate.e_score_correction_bias",)
DEEPSEEK_EXPERTS = (
    *QWEN_EXPERTS,
    Weight(_BIAS, "moe.expert_bias", COPY, (("experts",),), "expert_bias"),
    *(
        Weight((f"mlp.shared_experts.{p}_proj.weight",), f"moe.shared_{p}", TRANSPOSE, (shape,))
        for p, shape in (
            ("gate", ("shared_ffn", "hidden")),
            ("up", ("shared_ffn", "hidden")),
            ("down", ("hidden", "shared_ffn")),
        )
    ),
)

# DeepSeek-V3's multi-token prediction layer i, model.layers.{num_hidden_layers + i} in
# its checkpoint (DeepSeek-V3's README_WEIGHTS.md; vLLM's deepseek_mtp.py reads the same
# names), msgen's mtp.layers.{i} (msgen.analysis.mtp): enorm (the next token's
# embedding's norm), hnorm (the hidden state's), eh_proj [hidden, 2 hidden] over
# [enorm(embedding); hnorm(h)], embedding first in both, a decoder block,
# shared_head.norm; and embed_tokens and shared_head.head, copies of the main model's
# embedding and output layer, which the module shares.
DEEPSEEK_MTP = (
    Weight(("enorm.weight",), "enorm.gamma", COPY, (("hidden",),)),
    Weight(("hnorm.weight",), "hnorm.gamma", COPY, (("hidden",),)),
    Weight(("eh_proj.weight",), "eh_proj.weight", TRANSPOSE, (("hidden", "eh_in"),)),
    Weight(("shared_head.norm.weight",), "norm.gamma", COPY, (("hidden",),)),
    tied_copy("embed_tokens.weight", TABLE, COPY, ("vocab", "hidden")),
    tied_copy("shared_head.head.weight", OUTPUT, TRANSPOSE, ("vocab", "hidden"), "untied"),
    # a tied model's output layer is the embedding table
    tied_copy("shared_head.head.weight", TABLE, COPY, ("vocab", "hidden"), "tied"),
)

TABLES = {
    "llama": Family(ATTENTION, MLP),
    "qwen2": Family(ATTENTION, MLP),
    "mistral": Family(ATTENTION, MLP),
    "qwen3": Family(ATTENTION + QK_NORMS, MLP),
    "mixtral": Family(ATTENTION, MLP, MIXTRAL_EXPERTS),
    "qwen3_moe": Family(ATTENTION + QK_NORMS, MLP, QWEN_EXPERTS),
    "qwen2_moe": Family(ATTENTION, MLP, QWEN2_EXPERTS),
    "deepseek_v2": Family(MLA, MLP, DEEPSEEK_EXPERTS, DEEPSEEK_MTP),
    "deepseek_v3": Family(MLA, MLP, DEEPSEEK_EXPERTS, DEEPSEEK_MTP),
}
