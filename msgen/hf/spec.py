"""An HfModel as MSL text: the LLaMA-style block (RMSNorm, fused q/k/v laid out per kv
group, RoPE, SwiGLU as separate gate and up projections, no biases unless the model has
them), a sliding-window layer kind where the model has one, and a mesh, cluster and
training setup to start from. The caller lays the text out with `msgen fmt`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from msgen.checks.reserved import class_clash
from msgen.hf.config import HfModel

# Documentation addresses (RFC 5737) stand in for servers the user has not named yet:
# estimate and plan need only their count; compile's rank table needs the real ones.
PLACEHOLDER_NODES = "192.0.2."


@dataclass(frozen=True)
class Setup:
    """What the config does not say: the run's shape, chosen on the command line."""

    name: str
    seq: int
    device: str = "ascend910b"
    devices: int = 1
    per_node: int = 8
    global_batch: int = 64
    dp: int = 1
    tp: int = 1
    pp: int = 1


def model_name(text: str) -> str:
    """`Qwen2-0.5B` -> `qwen2_0_5b`: an MSL identifier from a model's folder name, one
    the generated code can use (a folder called `case` or `class` becomes `m_case`)."""
    name = re.sub(r"[^0-9a-zA-Z]+", "_", text).strip("_").lower()
    usable = name and not name[0].isdigit() and class_clash(name) is None
    return name if usable else f"m_{name}"


def _bias(flag: bool) -> str:
    return "" if flag else ", bias = false"


def _rope_scaling(m: HfModel) -> str:
    """`, rope_scaling = llama3(factor = 8.0, ...)`, as the config sets it."""
    if m.rope_scaling is None:
        return ""
    kind, params = m.rope_scaling
    shown = (f"{k} = {str(v).lower() if isinstance(v, bool) else repr(v)}" for k, v in params)
    return f", rope_scaling = {kind}({', '.join(shown)})"


def _layer(name: str, m: HfModel, window: bool) -> str:
    rope = "" if m.rope_theta == 10000.0 else f", rope_theta = {m.rope_theta!r}"
    rope += _rope_scaling(m)
    band = ", window = window" if window else ""
    mlp = _bias(m.mlp_bias)
    return f"""
layer {name} {{
    input x : [batch, seq, hidden] @ [dp, 1, 1]
    n1   = rmsnorm(x, eps = {m.eps!r})
    qkv  = linear(n1, (heads + 2 * kv_heads) * head_dim{_bias(m.qkv_bias)}) weight @ [1, tp]
    att  = attention(qkv, heads = heads, kv_heads = kv_heads, causal = true, rope = true{rope}{band}, flash = true) @ [dp, 1, tp]
    o    = linear(att, hidden{_bias(m.o_bias)}) weight @ [tp, 1]
    h    = x + o
    n2   = rmsnorm(h, eps = {m.eps!r})
    gate = linear(n2, ffn{mlp}) weight @ [1, tp]
    up   = linear(n2, ffn{mlp}) weight @ [1, tp]
    act  = silu(gate)
    mlp  = act * up
    down = linear(mlp, hidden{mlp}) weight @ [tp, 1]
    output h + down
}}
"""


def _body(m: HfModel) -> str:
    """The repeats, in layer order: full-attention layers, then sliding-window ones."""
    if m.window is None or m.window_from == 0:
        return "    body   = repeat decoder(emb) layers\n"
    return (
        f"    full   = repeat decoder(emb) {m.window_from}\n"
        f"    body   = repeat decoder_swa(full) layers - {m.window_from}\n"
    )


def _nodes(setup: Setup) -> str:
    count = max(1, setup.devices // setup.per_node)
    if count == 1:
        return '["127.0.0.1"]'
    return "[" + ", ".join(f'"{PLACEHOLDER_NODES}{i + 1}"' for i in range(count)) + "]"


def spec_text(m: HfModel, setup: Setup, source: str) -> str:
    """The spec for `m` run as `setup`, unformatted; `source` names the config."""
    head_dim = "hidden / heads" if m.head_dim_is_derived else str(m.head_dim)
    window = f"    window   = {m.window}\n" if m.window is not None else ""
    kinds = [_layer(kind, m, window) for kind, window in _kinds(m)]
    if m.tied:
        logits = "    logits = linear(norm, vocab, tie = emb)\n"
    else:
        logits = "    logits = linear(norm, vocab, bias = false) weight @ [1, tp]\n"
    recompute = "".join(f"    {kind} = full\n" for kind, _ in _kinds(m))
    per_node = min(setup.devices, setup.per_node)
    micro_batches = setup.global_batch // setup.dp
    return f"""# {setup.name}: imported from {source} ({m.family} family, {m.params:,} parameters).
# The cluster addresses are placeholders until you name your servers.
msl 0.1

model {setup.name} {{
    vocab    = {m.vocab}
    hidden   = {m.hidden}
    heads    = {m.heads}
    kv_heads = {m.kv_heads}
    head_dim = {head_dim}
    ffn      = {m.ffn}
    layers   = {m.layers}
    seq      = {setup.seq}
{window}    dtype    = {m.dtype}
    param_dtype = {m.param_dtype}
}}

cluster {{
    device   = {setup.device}
    per_node = {per_node}
    nodes    = {_nodes(setup)}
}}

mesh {{
    dp = {setup.dp}
    tp = {setup.tp}
    pp = {setup.pp}
}}
{''.join(kinds)}
network {{
    input tokens : [batch, seq] @ [dp, 1]
    emb    = embedding(tokens, vocab, hidden) table @ [tp, 1]
{_body(m)}    norm   = rmsnorm(body, eps = {m.eps!r})
{logits}    output cross_entropy(logits, tokens)
}}

recompute {{
{recompute}}}

pipeline {{
    micro_batches = {micro_batches}
    schedule      = 1f1b
}}

train {{
    micro_batch  = 1
    global_batch = {setup.global_batch}
    optimizer    = adamw(lr = 3e-5, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1)
    schedule     = cosine(warmup = 100, steps = 10000, min_lr = 3e-6)
    grad_clip    = 1.0
    checkpoint   = every 1000 keep 3
    seed         = 1234
}}
"""


def _kinds(m: HfModel) -> tuple[tuple[str, bool], ...]:
    """The layer kinds in network order, each with whether it has the sliding window:
    one kind when every layer is alike, else full attention then the window (Qwen2's
    layers from max_window_layers on)."""
    if m.window is None or m.window_from == 0:
        return (("decoder", m.window is not None),)
    return (("decoder", False), ("decoder_swa", True))
