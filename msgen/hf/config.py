"""A Hugging Face `config.json` of the LLaMA, Qwen2 or Mistral family, read into the
few numbers a spec needs, every one checked; anything msgen cannot reproduce exactly
is refused with its name, never dropped.

The keys and their defaults are transformers' own (`models/llama/configuration_llama.py`,
`models/qwen2/configuration_qwen2.py`, `models/mistral/configuration_mistral.py`); the
modelling facts each family adds are those of its `modeling_*.py`, cited where used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from msgen.base.readers import Bool, Int, List, Nullable, Num, Obj, Str, load_json
from msgen.base.status import UsageError
from msgen.diagnostics import printable
from msgen.lowering.evaluate import DIM_LIMIT
from msgen.ops.rope_scaling import REFUSED, SIGNATURES, ScalingError, resolved

CONFIG_LIMIT = 1 << 20  # a config.json is a few KiB; anything near this is not one

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

# model_type -> family. Qwen2 has q/k/v biases and no key for them
# (modeling_qwen2.py, Qwen2Attention: q_proj, k_proj, v_proj bias=True, o_proj bias=False).
FAMILIES = {"llama": "llama", "qwen2": "qwen2", "mistral": "mistral"}

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

    @property
    def head_dim_is_derived(self) -> bool:
        return self.head_dim * self.heads == self.hidden

    @property
    def params(self) -> int:
        """The model's parameter count as transformers builds it: embeddings, per layer
        q/k/v/o (+ biases), the MLP's gate/up/down (+ biases) and two RMSNorm weights,
        the final norm, and the output layer unless tied."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = self.hidden * (q + 2 * kv) + q * self.hidden
        attention += (q + 2 * kv) * self.qkv_bias + self.hidden * self.o_bias
        mlp = 3 * self.hidden * self.ffn + (2 * self.ffn + self.hidden) * self.mlp_bias
        layer = attention + mlp + 2 * self.hidden
        head = 0 if self.tied else self.vocab * self.hidden
        return self.vocab * self.hidden + self.layers * layer + self.hidden + head


# Every key msgen reads, typed and bounded, per family: a dim is a positive integer
# below the language's limit (msgen.lowering.evaluate.DIM_LIMIT, MSL106), so no wrong
# type, 400-digit count or unhashable value reaches a formula; a null is the key's
# default where transformers reads it so (num_key_value_heads, head_dim,
# sliding_window, rope_scaling). Keys msgen does not read are left alone.
_DIM = Int(1, DIM_LIMIT - 1)
_NAME = Str(max_len=64)  # a model type, an activation, a dtype: short words
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
SCHEMAS = {
    "llama": Obj(_REQUIRED, {**_COMMON, "mlp_bias": Bool()}),
    "qwen2": Obj(
        _REQUIRED,
        {
            **_COMMON,
            **_WINDOW,
            "use_sliding_window": Bool(),
            "max_window_layers": Int(0, DIM_LIMIT - 1),
        },
    ),
    "mistral": Obj(_REQUIRED, {**_COMMON, **_WINDOW}),
}


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
    if family == "llama" or window is None:
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
    if family == "qwen2":
        start = _given(config, "max_window_layers", layers)
        if not config.get("use_sliding_window", False) or start >= layers:
            return None, layers
    else:
        start = 0
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
    kind = Obj({"model_type": _NAME}).check(config, name)["model_type"]
    if kind not in FAMILIES:
        raise HfConfigError(
            f"{name}: model_type {kind!r} is not supported: msgen imports "
            + ", ".join(sorted(FAMILIES))
        )
    family = FAMILIES[kind]
    try:
        return _model(SCHEMAS[family].check(config, name), family)
    except HfConfigError as exc:
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
    head_dim = _given(config, "head_dim", hidden // heads)
    if head_dim * heads != hidden and config.get("head_dim") is None:
        raise HfConfigError(f"hidden_size {hidden} is not a multiple of {heads} heads")
    window, window_from = _window(config, family, layers)
    dtype, param_dtype, notes = _dtype(config)
    attention_bias = config.get("attention_bias", False)
    return HfModel(
        family=family,
        vocab=config["vocab_size"],
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        ffn=config["intermediate_size"],
        eps=_float(config, "rms_norm_eps"),
        tied=config.get("tie_word_embeddings", False),
        qkv_bias=family == "qwen2" or attention_bias,
        o_bias=family != "qwen2" and attention_bias,
        mlp_bias=family == "llama" and config.get("mlp_bias", False),
        rope_theta=_rope(config),
        rope_scaling=_rope_scaling(config),
        max_positions=config.get("max_position_embeddings"),
        window=window,
        window_from=window_from,
        dtype=dtype,
        param_dtype=param_dtype,
        notes=notes,
    )
