"""A Hugging Face `config.json` of the LLaMA, Qwen2 or Mistral family, read into the
few numbers a spec needs, every one checked; anything msgen cannot reproduce exactly
is refused with its name, never dropped.

The keys and their defaults are transformers' own (`models/llama/configuration_llama.py`,
`models/qwen2/configuration_qwen2.py`, `models/mistral/configuration_mistral.py`); the
modelling facts each family adds are those of its `modeling_*.py`, cited where used.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from msgen.base.files import read_regular

CONFIG_LIMIT = 1 << 20  # a config.json is a few KiB; anything near this is not one

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


class HfConfigError(Exception):
    """A config msgen cannot turn into a spec that means the same model."""


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


def read_config(path: Path) -> dict:
    """config.json as a dict; HfConfigError naming the file for anything else."""
    try:
        data = json.loads(read_regular(path, CONFIG_LIMIT).decode("utf-8"))
    except OSError as exc:
        raise HfConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise HfConfigError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise HfConfigError(f"{path} is not a config.json (a JSON object)")
    return data


def _int(config: dict, key: str, default: int | None = None, positive: bool = True) -> int:
    value = config.get(key, default)
    if value is None:
        raise HfConfigError(f"config.json has no {key}")
    if isinstance(value, bool) or not isinstance(value, int) or (positive and value < 1):
        raise HfConfigError(f"{key} = {value!r} is not a positive integer")
    return value


def _float(config: dict, key: str) -> float:
    value = config.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HfConfigError(f"config.json has no numeric {key} (it is read, never assumed)")
    if not math.isfinite(value) or value <= 0:
        raise HfConfigError(f"{key} = {value!r} is not a positive number")
    return float(value)


def _rope(config: dict) -> float:
    """rope_theta from the transformers 4 form (`rope_theta`, `rope_scaling`) or the
    transformers 5 form (`rope_parameters`); any scaling but `default` is refused."""
    params = config.get("rope_parameters")
    scaling = config.get("rope_scaling")
    for source in (params, scaling):
        if source is None:
            continue
        if not isinstance(source, dict):
            raise HfConfigError(f"rope parameters {source!r} are not an object")
        kind = source.get("rope_type", source.get("type", "default"))
        if kind != "default":
            raise HfConfigError(
                f"rope_type {kind!r} is not supported: msgen's attention has plain RoPE "
                "only (rope_type 'default'); llama3, yarn, linear, dynamic and longrope "
                "scaling would change the model"
            )
    if isinstance(params, dict) and "rope_theta" in params:
        return _float(params, "rope_theta")
    if "rope_theta" in config:
        return _float(config, "rope_theta")
    return 10000.0  # transformers' default for all three families


def _window(config: dict, family: str, layers: int) -> tuple[int | None, int]:
    """The sliding window and the first layer it applies to. Mistral's applies to every
    layer (modeling_mistral.py); Qwen2's only with use_sliding_window, and only from
    max_window_layers on (configuration_qwen2.py: layer_types); LLaMA has none."""
    window = config.get("sliding_window")
    if family == "llama" or window is None:
        return None, layers
    kinds = config.get("layer_types")
    if kinds is not None:  # transformers >= 4.53 writes the per-layer kinds out
        if not isinstance(kinds, list) or len(kinds) != layers:
            raise HfConfigError(f"layer_types is not a list of {layers} layer kinds")
        sliding = [i for i, kind in enumerate(kinds) if kind == "sliding_attention"]
        if not sliding:
            return None, layers
        if sliding != list(range(sliding[0], layers)):
            raise HfConfigError(
                "layer_types mixes full and sliding-window layers in an order msgen does "
                "not write (full attention first, then the sliding window)"
            )
        return _positive_window(window), sliding[0]
    if family == "qwen2":
        if not config.get("use_sliding_window", False):
            return None, layers
        start = _int(config, "max_window_layers", layers, positive=False)
        if start >= layers:
            return None, layers
    else:
        start = 0
    return _positive_window(window), start


def _positive_window(window) -> int:
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise HfConfigError(f"sliding_window = {window!r} is not a positive integer")
    return window


def _dtype(config: dict) -> tuple[str, str, tuple[str, ...]]:
    name = config.get("dtype", config.get("torch_dtype"))
    if name is None:
        return "bf16", "fp32", ("config.json names no dtype: bf16 compute, fp32 parameters",)
    if name not in DTYPES:
        raise HfConfigError(f"dtype {name!r} is not supported (float32, bfloat16, float16)")
    return (*DTYPES[name], ())


def model_of(config: dict) -> HfModel:
    """The HfModel a config describes; HfConfigError for what msgen cannot mean."""
    kind = config.get("model_type")
    if kind not in FAMILIES:
        raise HfConfigError(
            f"model_type {kind!r} is not supported: msgen imports " + ", ".join(sorted(FAMILIES))
        )
    family = FAMILIES[kind]
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise HfConfigError(f"hidden_act {act!r} is not supported: the MLP is SwiGLU (silu)")
    hidden = _int(config, "hidden_size")
    layers = _int(config, "num_hidden_layers")
    heads = _int(config, "num_attention_heads")
    kv_heads = _int(config, "num_key_value_heads", heads)
    if heads % kv_heads:
        raise HfConfigError(f"num_key_value_heads = {kv_heads} does not divide heads = {heads}")
    head_dim = config.get("head_dim")
    head_dim = hidden // heads if head_dim is None else _int(config, "head_dim")
    if head_dim * heads != hidden and "head_dim" not in config:
        raise HfConfigError(f"hidden_size {hidden} is not a multiple of {heads} heads")
    window, window_from = _window(config, family, layers)
    max_positions = config.get("max_position_embeddings")
    dtype, param_dtype, notes = _dtype(config)
    attention_bias = bool(config.get("attention_bias", False))
    return HfModel(
        family=family,
        vocab=_int(config, "vocab_size"),
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        ffn=_int(config, "intermediate_size"),
        eps=_float(config, "rms_norm_eps"),
        tied=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=family == "qwen2" or attention_bias,
        o_bias=family != "qwen2" and attention_bias,
        mlp_bias=family == "llama" and bool(config.get("mlp_bias", False)),
        rope_theta=_rope(config),
        max_positions=max_positions if isinstance(max_positions, int) else None,
        window=window,
        window_from=window_from,
        dtype=dtype,
        param_dtype=param_dtype,
        notes=notes,
    )
