"""Every `config.json` key msgen reads, typed and bounded, per family (`SCHEMAS`):
checked before msgen.hf.config reads a number from it. The keys are transformers' own
(`models/<family>/configuration_*.py` of transformers 4.57).
"""

from __future__ import annotations

from msgen.base.readers import Bool, Int, List, Nullable, Num, Obj, Str
from msgen.hf import deepseek
from msgen.hf.experts import MOE_KEYS
from msgen.lowering.evaluate import DIM_LIMIT

# rope_scaling's numbers as transformers 4.57's modeling_rope_utils reads them
ROPE_SCALING_NUMBERS = (
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "beta_fast",
    "beta_slow",
    "mscale",
    "mscale_all_dim",
    "attention_factor",
)

# Every key msgen reads, typed and bounded, per family: a dim is a positive integer
# below the language's limit (msgen.lowering.evaluate.DIM_LIMIT, MSL106), so no wrong
# type, 400-digit count or unhashable value reaches a formula; a null is the key's
# default where transformers reads it so (num_key_value_heads, head_dim,
# sliding_window, rope_scaling). Keys msgen does not read are left alone.
_DIM = Int(1, DIM_LIMIT - 1)
_NAME = Str(max_len=64)  # a model type, an activation, a dtype: short words
MODEL_TYPE = Obj({"model_type": _NAME})  # read first: it chooses the schema
_SCALE = Nullable(Num(0.0, None))
_ROPE = Nullable(
    Obj(
        optional={
            "rope_type": _NAME,
            "type": _NAME,
            "rope_theta": Num(),
            **{key: _SCALE for key in ROPE_SCALING_NUMBERS},
            "original_max_position_embeddings": Nullable(_DIM),
            "truncate": Bool(),
        }
    )
)
_COMMON = {
    "hidden_act": _NAME,
    "num_key_value_heads": Nullable(_DIM),
    "head_dim": Nullable(_DIM),
    "max_position_embeddings": Nullable(_DIM),
    "rope_theta": Num(),
    "rope_scaling": _ROPE,
    "rope_parameters": _ROPE,
    "tie_word_embeddings": Bool(),
    "attention_bias": Bool(),
    "dtype": Nullable(_NAME),
    "torch_dtype": Nullable(_NAME),
}
_REQUIRED = {
    "model_type": _NAME,
    "vocab_size": _DIM,
    "hidden_size": _DIM,
    "num_hidden_layers": _DIM,
    "num_attention_heads": _DIM,
    "intermediate_size": _DIM,
    "rms_norm_eps": Num(),  # read, never assumed
}
_WINDOW = {"sliding_window": Nullable(_DIM), "layer_types": List(_NAME, max_len=DIM_LIMIT)}
_USED_WINDOW = {**_WINDOW, "use_sliding_window": Bool(), "max_window_layers": Int(0, DIM_LIMIT - 1)}
# the experts' families name their expert width elsewhere (Mixtral: intermediate_size;
# Qwen3-MoE: moe_intermediate_size, intermediate_size the dense layers')
# (optional there, with transformers' defaults: msgen.hf.experts)
_SPARSE = {k: v for k, v in _REQUIRED.items() if k != "intermediate_size"}
SCHEMAS = {
    "llama": Obj(_REQUIRED, {**_COMMON, "mlp_bias": Bool()}),
    "qwen2": Obj(_REQUIRED, {**_COMMON, **_USED_WINDOW}),
    "qwen3": Obj(_REQUIRED, {**_COMMON, **_USED_WINDOW}),
    "mistral": Obj(_REQUIRED, {**_COMMON, **_WINDOW}),
    "mixtral": Obj(_SPARSE, {**_COMMON, **_WINDOW, **MOE_KEYS["mixtral"]}),
    "qwen3_moe": Obj(_SPARSE, {**_COMMON, **_USED_WINDOW, **MOE_KEYS["qwen3_moe"]}),
    "qwen2_moe": Obj(
        _SPARSE, {**_COMMON, **_USED_WINDOW, **MOE_KEYS["qwen2_moe"], "qkv_bias": Bool()}
    ),
    "deepseek_v2": Obj(_SPARSE, {**_COMMON, **deepseek.KEYS}),
    "deepseek_v3": Obj(_SPARSE, {**_COMMON, **deepseek.KEYS}),
}
