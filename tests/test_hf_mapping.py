"""The mapping tables (msgen/hf/families.py) without transformers or MindSpore: for every
family, each row's two directions are inverses on random tensors (Hugging Face ->
msgen -> Hugging Face gives every tensor back exactly), and the shape a row states for
its msgen parameter is the shape its map makes. (That the msgen side is what the
generated model computes with is tests/test_ckpt_hf.py's: logits against
transformers.)"""

from __future__ import annotations

import numpy as np
import pytest

from msgen.hf.config import model_of
from msgen.hf.families import TABLES
from msgen.hf.layout import hf_shapes, msgen_shapes, to_hf, to_msgen

BASE = {
    "hidden_size": 16,
    "intermediate_size": 24,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 3,
    "vocab_size": 32,
    "rms_norm_eps": 1e-6,
}
# the latent attention's sizes (q LoRA set per family), 4 experts after a dense layer
DEEPSEEK = {
    "kv_lora_rank": 8,
    "qk_nope_head_dim": 4,
    "qk_rope_head_dim": 4,
    "v_head_dim": 6,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 8,
    "first_k_dense_replace": 1,
}
CONFIGS = {
    "llama": {"attention_bias": True, "mlp_bias": True},
    "qwen2": {"tie_word_embeddings": True},
    "qwen3": {"head_dim": 8},
    "mistral": {},
    "mixtral": {"num_local_experts": 3},
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
                  "mlp_only_layers": [1]},  # fmt: skip
    "qwen2_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 8,
                  "shared_expert_intermediate_size": 12, "decoder_sparse_step": 2},  # fmt: skip
    "deepseek_v2": {**DEEPSEEK, "q_lora_rank": None},
    "deepseek_v3": {**DEEPSEEK, "q_lora_rank": 6, "n_group": 2, "topk_group": 1},
}


def test_every_family_has_a_config_here():
    assert set(CONFIGS) == set(TABLES)


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_each_row_goes_there_and_back_exactly(family):
    m = model_of({"model_type": family, **BASE, **CONFIGS[family]})
    rng = np.random.default_rng(0)
    source = {n: rng.standard_normal(s).astype(np.float32) for n, s in hf_shapes(m).items()}
    converted = dict(to_msgen(m, source.__getitem__))
    assert {n: a.shape for n, a in converted.items()} == msgen_shapes(m)
    back = dict(to_hf(m, converted.__getitem__))
    assert set(back) == set(source)
    for name, array in source.items():
        assert np.array_equal(back[name], array), name
    # and the experts land stacked in their order (expert e at index e, transposed)
    if m.moe is not None:
        sparse = next(i for i in range(m.layers) if m.sparse(i))
        (gate,) = [n for n in converted if n.endswith("moe.gate")][:1]
        experts = [n for n in source if f"layers.{sparse}." in n and ".experts." in n]
        first = sorted(n for n in experts if ".0." in n and ("w1" in n or "gate_proj" in n))
        assert np.array_equal(converted[gate][0], source[first[0]].T)
