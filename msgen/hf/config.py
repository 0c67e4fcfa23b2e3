"""A Hugging Face `config.json` of the LLaMA, Qwen2, Qwen3, Mistral, Mixtral, Qwen2-MoE
or Qwen3-MoE family, read into the few numbers a spec needs, every one checked; anything
msgen cannot reproduce exactly is refused with its name, never dropped.

The keys and their defaults are transformers' own (`models/<family>/configuration_*.py`
of transformers 4.57); the modelling facts each family adds are those of its
`modeling_*.py`, cited where used. The keys' types and bounds are checked first
(msgen.hf.config_schema); the experts' keys are read in msgen.hf.experts, DeepSeek's in
msgen.hf.deepseek; what comes out is an HfModel (msgen.hf.model).
"""

from __future__ import annotations

from pathlib import Path

from msgen.base.readers import Obj, load_json
from msgen.base.status import UsageError
from msgen.diagnostics import printable
from msgen.hf import deepseek
from msgen.hf.config_schema import MODEL_TYPE, SCHEMAS
from msgen.hf.deepseek import DeepseekError
from msgen.hf.experts import DEFAULTS, MOE_KEYS, ExpertsError, moe_of
from msgen.hf.model import HfModel
from msgen.ops.rope_scaling import REFUSED, SIGNATURES, ScalingError, resolved

CONFIG_LIMIT = 1 << 20  # a config.json is a few KiB; anything near this is not one

# model_type -> family. Qwen2 has q/k/v biases and no key for them
# (modeling_qwen2.py, Qwen2Attention: q_proj, k_proj, v_proj bias=True, o_proj bias=False).
FAMILIES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "mistral": "mistral",
    "mixtral": "mixtral",
    "qwen3_moe": "qwen3_moe",
    "qwen2_moe": "qwen2_moe",
    "deepseek_v2": "deepseek_v2",
    "deepseek_v3": "deepseek_v3",
}
# head_dim when config.json has none: Qwen3Config's own default is 128
# (configuration_qwen3.py); the others derive it, hidden / heads.
HEAD_DIM_DEFAULT = {"qwen3": 128}
# which layers the sliding window covers, per family: every layer (modeling_mistral.py,
# modeling_mixtral.py), from max_window_layers on when use_sliding_window
# (configuration_qwen2.py, configuration_qwen3.py: layer_types), every layer when
# use_sliding_window (configuration_qwen3_moe.py sets sliding_window to None otherwise)
WINDOWS = {
    "mistral": "all",
    "mixtral": "all",
    "qwen2": "from max_window_layers",
    "qwen3": "from max_window_layers",
    "qwen3_moe": "when used",
}

# transformers' DTYPE names -> (compute dtype, parameter dtype). bf16 and fp16 train with
# fp32 parameters, as mindformers keeps them (param_init_type float32 in its configs).
DTYPES = {
    "float32": ("fp32", "fp32"),
    "bfloat16": ("bf16", "fp32"),
    "float16": ("fp16", "fp32"),
}


class HfConfigError(UsageError):
    """A config msgen cannot turn into a spec that means the same model (status 2, one
    line, wherever the config is read: import hf, ckpt from-hf, to-hf's source.json)."""


def read_config(path: Path) -> dict:
    """config.json as a dict (bounded in size and depth; its types are checked by
    `model_of`); BadInput naming the file otherwise."""
    return load_json(path, CONFIG_LIMIT, Obj())


def load_model(path: Path) -> HfModel:
    """The HfModel of the config.json at `path`, every refusal naming the file."""
    return model_of(read_config(path), printable(str(path)))


def _given(config: dict, key: str, default):
    """A key the schema checked, or `default` when absent or null."""
    value = config.get(key)
    return default if value is None else value


def _float(config: dict, key: str) -> float:
    value = config[key]  # a finite number: the schema and the JSON reader say so
    if value <= 0:
        raise HfConfigError(f"{key} = {value!r} is not a positive number")
    return float(value)


def _rope_source(config: dict) -> dict:
    """The RoPE settings: transformers 5's `rope_parameters`, else transformers 4's
    `rope_scaling` (with `rope_theta` beside it)."""
    return config.get("rope_parameters") or config.get("rope_scaling") or {}


def _rope(config: dict) -> float:
    """rope_theta from the transformers 4 form (`rope_theta`, `rope_scaling`) or the
    transformers 5 form (`rope_parameters`)."""
    params = config.get("rope_parameters")
    if params and "rope_theta" in params:
        return _float(params, "rope_theta")
    if "rope_theta" in config:
        return _float(config, "rope_theta")
    return 10000.0  # transformers' default for all three families


def _rope_scaling(config: dict) -> tuple[str, tuple[tuple[str, float | bool], ...]] | None:
    """The RoPE scaling and the parameters transformers 4.57 reads for it
    (modeling_rope_utils: ROPE_INIT_FUNCTIONS), None for plain RoPE; a scaling msgen
    does not reproduce, or a parameter missing or out of range, refused naming it."""
    source = _rope_source(config)
    kind = source.get("rope_type", source.get("type", "default"))
    if kind == "default":
        return None
    if kind in REFUSED:
        raise HfConfigError(f"rope_type {kind!r} is not supported: {REFUSED[kind]}")
    if kind not in SIGNATURES:
        raise HfConfigError(
            f"rope_type {kind!r} is not supported: msgen takes default, " + ", ".join(SIGNATURES)
        )
    required, optional = SIGNATURES[kind]
    given = {k: source[k] for k in (*required, *optional) if source.get(k) is not None}
    context = config.get("max_position_embeddings")
    if kind == "yarn" and "original_max_position_embeddings" not in given and context:
        given["original_max_position_embeddings"] = context  # transformers' fallback
    where = "rope_parameters" if config.get("rope_parameters") else "rope_scaling"
    missing = [k for k in required if k not in given]
    if missing:
        raise HfConfigError(f"{where} of rope_type {kind!r} lacks {missing[0]}")
    try:
        resolved(kind, given)
    except ScalingError as exc:
        raise HfConfigError(f"{where}.{exc.key}: {exc.message}") from None
    return kind, tuple(given.items())


def _window(config: dict, family: str, layers: int) -> tuple[int | None, int]:
    """The sliding window and the first layer it applies to. Mistral's applies to every
    layer (modeling_mistral.py); Qwen2's only with use_sliding_window, and only from
    max_window_layers on (configuration_qwen2.py: layer_types); LLaMA has none."""
    window = config.get("sliding_window")
    if family not in WINDOWS or window is None:
        return None, layers
    kinds = config.get("layer_types")
    if kinds is not None:  # transformers >= 4.53 writes the per-layer kinds out
        if len(kinds) != layers:
            raise HfConfigError(f"layer_types has {len(kinds)} layer kinds, not {layers}")
        sliding = [i for i, kind in enumerate(kinds) if kind == "sliding_attention"]
        if not sliding:
            return None, layers
        if sliding != list(range(sliding[0], layers)):
            raise HfConfigError(
                "layer_types mixes full and sliding-window layers in an order msgen does "
                "not write (full attention first, then the sliding window)"
            )
        return window, sliding[0]
    start = 0
    if WINDOWS[family] != "all" and not config.get("use_sliding_window", False):
        return None, layers
    if WINDOWS[family] == "from max_window_layers":
        start = _given(config, "max_window_layers", layers)
        if start >= layers:
            return None, layers
    return window, start


def _dtype(config: dict) -> tuple[str, str, tuple[str, ...]]:
    name = _given(config, "dtype", config.get("torch_dtype"))  # transformers 5's name first
    if name is None:
        return "bf16", "fp32", ("config.json names no dtype: bf16 compute, fp32 parameters",)
    if name not in DTYPES:
        raise HfConfigError(f"dtype {name!r} is not supported (float32, bfloat16, float16)")
    return (*DTYPES[name], ())


def model_of(config: dict, name: str = "config.json") -> HfModel:
    """The HfModel a config (read from the file called `name`) describes: BadInput
    naming the key for a value of the wrong type or size, HfConfigError naming it for
    what msgen cannot mean."""
    kind = MODEL_TYPE.check(config, name)["model_type"]
    if kind not in FAMILIES:
        raise HfConfigError(
            f"{name}: model_type {kind!r} is not supported: msgen imports "
            + ", ".join(sorted(FAMILIES))
        )
    family = FAMILIES[kind]
    experts = [key for key in ("num_local_experts", "num_experts") if key in config]
    if family not in MOE_KEYS and family not in deepseek.DEFAULTS and experts:
        raise HfConfigError(
            f"{name}: model_type {kind!r} with {experts[0]}: transformers builds a dense "
            f"{kind} model and never reads the experts' keys; a mixture of experts has "
            "model_type mixtral, qwen2_moe or qwen3_moe"
        )
    try:
        return _model(SCHEMAS[family].check(config, name), family)
    except (HfConfigError, ExpertsError, DeepseekError) as exc:
        raise HfConfigError(f"{name}: {exc}") from None


def _model(config: dict, family: str) -> HfModel:
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise HfConfigError(f"hidden_act {act!r} is not supported: the MLP is SwiGLU (silu)")
    hidden = config["hidden_size"]
    layers = config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    kv_heads = _given(config, "num_key_value_heads", heads)
    if heads % kv_heads:
        raise HfConfigError(f"num_key_value_heads = {kv_heads} does not divide heads = {heads}")
    head_dim = _given(config, "head_dim", HEAD_DIM_DEFAULT.get(family, hidden // heads))
    mla = deepseek.mla_of(config, family) if family in deepseek.DEFAULTS else None
    if head_dim * heads != hidden and config.get("head_dim") is None and mla is None:
        raise HfConfigError(f"hidden_size {hidden} is not a multiple of {heads} heads")
    if family == "qwen2_moe" and config.get("use_sliding_window", False):
        raise HfConfigError(
            "use_sliding_window is true: Qwen2-MoE's attention implementations disagree "
            "on which layers it covers (modeling_qwen2_moe.py: the flash path from "
            "max_window_layers on, the mask for every layer)"
        )
    window, window_from = _window(config, family, layers)
    dtype, param_dtype, notes = _dtype(config)
    attention_bias = config.get("attention_bias", False)
    eps = _float(config, "rms_norm_eps")
    qk_norm = family in ("qwen3", "qwen3_moe")  # modeling_qwen3*.py: q_norm, k_norm
    if qk_norm and eps != 1e-6:
        raise HfConfigError(
            f"rms_norm_eps = {eps!r}: Qwen3's q/k norms use it, and msgen's attention "
            "qk_norm has eps 1e-6"
        )
    moe = moe_of(config, family, layers) if family in MOE_KEYS else None
    if mla is not None:
        moe = deepseek.moe_of(config, family, layers)
    mtp = deepseek.mtp_of(config, family, layers) if mla is not None else 0
    if moe is not None and moe.aux_coef and not config.get("output_router_logits", False):
        notes += (
            "router_aux_loss_coef is trained with (transformers adds it to the loss only "
            "with output_router_logits)",
        )
    return HfModel(
        family=family,
        vocab=config["vocab_size"],
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        ffn=config.get("intermediate_size")
        or {**DEFAULTS, **deepseek.DEFAULTS}[family]["intermediate_size"],
        eps=eps,
        tied=config.get("tie_word_embeddings", False),
        # Qwen2-MoE's q/k/v biases: its own key, default true (configuration_qwen2_moe.py)
        qkv_bias=family == "qwen2"
        or config.get("qkv_bias", family == "qwen2_moe")
        or attention_bias,
        o_bias=family not in ("qwen2", "qwen2_moe") and attention_bias,
        mlp_bias=family == "llama" and config.get("mlp_bias", False),
        rope_theta=_rope(config),
        rope_scaling=_rope_scaling(config),
        max_positions=config.get("max_position_embeddings"),
        window=window,
        window_from=window_from,
        dtype=dtype,
        param_dtype=param_dtype,
        notes=notes,
        qk_norm=qk_norm,
        moe=moe,
        mla=mla,
        mtp=mtp,
    )
