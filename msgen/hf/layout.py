"""Where each Hugging Face tensor goes in msgen's parameters, and back.

Hugging Face (modeling_llama.py, modeling_qwen2.py, modeling_mistral.py) keeps
`nn.Linear` weights as [out, in]; msgen's linear weight is [in, out] (x @ weight).
q, k and v are three projections there; here one `qkv` laid out per kv group (its
query heads, then its k head, then its v head), which is the order repeat_kv pairs
them in: query head h uses kv head h // (heads / kv_heads). Both rotate half for RoPE,
so no permutation of q or k. gate and up stay two projections. A tied model has no
`lm_head.weight` and msgen's output layer uses `emb.table`.

All functions are pure: arrays in, arrays out, one parameter at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from msgen.hf.config import HfModel

Get = Callable[[str], np.ndarray]

# per layer: msgen op.param <- Hugging Face module, for the plain (transposed) ones
LAYER_LINEARS = {
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}
LAYER_NORMS = {"n1.gamma": "input_layernorm.weight", "n2.gamma": "post_attention_layernorm.weight"}


def _has_bias(m: HfModel, key: str) -> bool:
    """Whether the plain projection `key` (LAYER_LINEARS) has a bias: o its own flag,
    the MLP's three theirs."""
    return m.o_bias if key == "o" else m.mlp_bias


def layer_path(m: HfModel, i: int) -> str:
    """msgen's path of Hugging Face layer i: `decoder.i`, or `decoder_swa.j` for the
    sliding-window layers Qwen2 puts after max_window_layers (msgen.hf.spec)."""
    if m.window is not None and 0 < m.window_from <= i:
        return f"decoder_swa.{i - m.window_from}"
    return f"decoder.{i}"


def _group_order(m: HfModel) -> np.ndarray:
    """Row indices of [q; k; v] (Hugging Face's three projections stacked) in msgen's
    per-kv-group order."""
    d, r = m.head_dim, m.heads // m.kv_heads
    q_rows = m.heads * d
    k_rows = m.kv_heads * d
    order = []
    for j in range(m.kv_heads):
        order.extend(range(j * r * d, (j + 1) * r * d))  # the group's query heads
        order.extend(range(q_rows + j * d, q_rows + (j + 1) * d))  # its k
        order.extend(range(q_rows + k_rows + j * d, q_rows + k_rows + (j + 1) * d))  # its v
    return np.asarray(order)


def hf_names(m: HfModel) -> list[str]:
    """Every tensor name the Hugging Face model has."""
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not m.tied:
        names.append("lm_head.weight")
    for i in range(m.layers):
        p = f"model.layers.{i}."
        names += [p + v for v in LAYER_NORMS.values()]
        for proj in ("q_proj", "k_proj", "v_proj"):
            names.append(f"{p}self_attn.{proj}.weight")
            if m.qkv_bias:
                names.append(f"{p}self_attn.{proj}.bias")
        for key, module in LAYER_LINEARS.items():
            names.append(f"{p}{module}.weight")
            if _has_bias(m, key):
                names.append(f"{p}{module}.bias")
    return names


def hf_shapes(m: HfModel) -> dict[str, tuple[int, ...]]:
    """Every tensor of the Hugging Face model with the shape transformers gives it
    (nn.Linear weights [out, in], biases [out], embeddings [vocab, hidden])."""
    q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
    rows = {"q_proj": q, "k_proj": kv, "v_proj": kv, "o_proj": m.hidden}
    rows |= {"gate_proj": m.ffn, "up_proj": m.ffn, "down_proj": m.hidden}
    cols = {"o_proj": q, "down_proj": m.ffn}
    shapes = {}
    for name in hf_names(m):
        module, _, kind = name.rpartition(".")
        proj = module.rpartition(".")[2]
        if proj in rows:
            out = rows[proj]
            shapes[name] = (out, cols.get(proj, m.hidden)) if kind == "weight" else (out,)
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            shapes[name] = (m.vocab, m.hidden)
        else:  # the RMSNorm weights
            shapes[name] = (m.hidden,)
    return shapes


def msgen_prefix(m: HfModel, name: str) -> str:
    """The msgen op path (with its trailing dot) the Hugging Face tensor `name` goes
    into, as to_msgen places it."""
    if name.startswith("model.layers."):
        return layer_path(m, int(name.split(".")[2])) + "."
    return {"model.embed_tokens.weight": "emb.", "model.norm.weight": "norm."}.get(name, "logits.")


def to_msgen(m: HfModel, get: Get) -> Iterator[tuple[str, np.ndarray]]:
    """(msgen parameter path, array) for every parameter, from Hugging Face tensors
    fetched one at a time by `get(name)`."""
    yield "emb.table", get("model.embed_tokens.weight")
    order = _group_order(m)
    for i in range(m.layers):
        hf, ms = f"model.layers.{i}.", layer_path(m, i) + "."
        for key, name in LAYER_NORMS.items():
            yield ms + key, get(hf + name)
        qkv = [get(f"{hf}self_attn.{p}.weight") for p in ("q_proj", "k_proj", "v_proj")]
        yield ms + "qkv.weight", np.concatenate(qkv)[order].T
        if m.qkv_bias:
            bias = [get(f"{hf}self_attn.{p}.bias") for p in ("q_proj", "k_proj", "v_proj")]
            yield ms + "qkv.bias", np.concatenate(bias)[order]
        for key, module in LAYER_LINEARS.items():
            yield f"{ms}{key}.weight", get(f"{hf}{module}.weight").T
            if _has_bias(m, key):
                yield f"{ms}{key}.bias", get(f"{hf}{module}.bias")
    yield "norm.gamma", get("model.norm.weight")
    if not m.tied:
        yield "logits.weight", get("lm_head.weight").T


def to_hf(m: HfModel, get: Get) -> Iterator[tuple[str, np.ndarray]]:
    """(Hugging Face name, array) for every tensor, from msgen parameters fetched one
    at a time by `get(path)`: the inverse of to_msgen."""
    yield "model.embed_tokens.weight", get("emb.table")
    inverse = np.argsort(_group_order(m))
    q_rows, kv_rows = m.heads * m.head_dim, m.kv_heads * m.head_dim
    bounds = (0, q_rows, q_rows + kv_rows, q_rows + 2 * kv_rows)
    for i in range(m.layers):
        hf, ms = f"model.layers.{i}.", layer_path(m, i) + "."
        for key, name in LAYER_NORMS.items():
            yield hf + name, get(ms + key)
        stacked = get(ms + "qkv.weight").T[inverse]
        biases = get(ms + "qkv.bias")[inverse] if m.qkv_bias else None
        for n, proj in enumerate(("q_proj", "k_proj", "v_proj")):
            yield f"{hf}self_attn.{proj}.weight", stacked[bounds[n] : bounds[n + 1]]
            if biases is not None:
                yield f"{hf}self_attn.{proj}.bias", biases[bounds[n] : bounds[n + 1]]
        for key, module in LAYER_LINEARS.items():
            yield f"{hf}{module}.weight", get(f"{ms}{key}.weight").T
            if _has_bias(m, key):
                yield f"{hf}{module}.bias", get(f"{ms}{key}.bias")
    yield "model.norm.weight", get("norm.gamma")
    if not m.tied:
        yield "lm_head.weight", get("logits.weight").T
