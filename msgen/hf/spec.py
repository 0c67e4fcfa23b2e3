"""An HfModel as MSL text: the LLaMA-style block (RMSNorm, fused q/k/v laid out per kv
group, RoPE, q/k norms where the model has them, SwiGLU as separate gate and up
projections or the experts, no biases unless the model has them), a layer kind per
sort of layer (msgen.hf.kinds), and a mesh, cluster and training setup to start from.
The caller lays the text out with `msgen fmt`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from msgen.checks.reserved import class_clash
from msgen.hf.kinds import Run, runs
from msgen.hf.model import HfModel

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


def _feed_forward(m: HfModel, sparse: bool) -> str:
    """The layer's MLP, SwiGLU as separate gate and up projections, or its experts:
    dropless, routed as transformers routes (msgen.hf.experts)."""
    if sparse:
        e = m.moe
        norm = "" if e.norm_topk else ", norm_topk = false"
        aux = f", aux_loss = {e.aux_loss!r}" if e.aux_loss else ""
        shared = ", shared_ffn = shared_ffn" if e.shared_ffn else ""
        shared += ", shared_sigmoid = true" if e.shared_ffn and e.shared_sigmoid else ""
        routing = e.routing.arguments() if e.routing is not None else ""
        return (
            f"    moe  = moe(n2, experts = {e.experts}, top_k = {e.top_k}, ffn = moe_ffn"
            f"{shared}{norm}{routing}{aux})\n    output h + moe\n"
        )
    mlp = _bias(m.mlp_bias)
    return f"""    gate = linear(n2, ffn{mlp}) weight @ [1, tp]
    up   = linear(n2, ffn{mlp}) weight @ [1, tp]
    act  = silu(gate)
    mlp  = act * up
    down = linear(mlp, hidden{mlp}) weight @ [tp, 1]
    output h + down
"""


def _mla(m: HfModel, rope: str) -> str:
    """DeepSeek's latent attention (msgen.hf.deepseek), flash where the kernel takes
    its head size (docs/language.md, `mla`)."""
    a = m.mla
    q = "" if a.q_lora_rank is None else f", q_lora_rank = {a.q_lora_rank}"
    flash = a.qk % 16 == 0 and a.qk <= 512 and a.v <= a.qk
    return (
        f"    att  = mla(n1, heads = heads{q}, kv_lora_rank = {a.kv_lora_rank}, "
        f"qk_nope_head_dim = {a.nope}, qk_rope_head_dim = {a.rope}, v_head_dim = {a.v}"
        f"{rope}{'' if a.interleave else ', rope_interleave = false'}"
        f"{'' if a.yarn_mscale else ', yarn_mscale = false'}, eps = {m.eps!r}"
        f"{', flash = true' if flash else ''}) @ [dp, 1, tp]\n"
    )


def _layer(m: HfModel, run: Run) -> str:
    rope = "" if m.rope_theta == 10000.0 else f", rope_theta = {m.rope_theta!r}"
    rope += _rope_scaling(m)
    band = ", window = window" if run.window else ""
    norm = ", qk_norm = true" if m.qk_norm else ""
    if m.mla is not None:
        attention = _mla(m, rope)
    else:
        attention = f"""    qkv  = linear(n1, (heads + 2 * kv_heads) * head_dim{_bias(m.qkv_bias)}) weight @ [1, tp]
    att  = attention(qkv, heads = heads, kv_heads = kv_heads, causal = true, rope = true{rope}{band}{norm}, flash = true) @ [dp, 1, tp]
"""
    return f"""
layer {run.kind} {{
    input x : [batch, seq, hidden] @ [dp, 1, 1]
    n1   = rmsnorm(x, eps = {m.eps!r})
{attention}    o    = linear(att, hidden{_bias(m.o_bias)}) weight @ [tp, 1]
    h    = x + o
    n2   = rmsnorm(h, eps = {m.eps!r})
{_feed_forward(m, run.sparse)}}}
"""


def _body(found: tuple[Run, ...]) -> str:
    """The repeats, in layer order, the last one's count `layers` less the others'."""
    lines, x = [], "emb"
    for n, run in enumerate(found):
        last = n == len(found) - 1
        count = "layers" + "".join(f" - {r.count}" for r in found[:-1]) if last else run.count
        out = "body" if last else f"part{n + 1}"
        lines.append(f"    {out:<6} = repeat {run.kind}({x}) {count}\n")
        x = out
    return "".join(lines)


def _nodes(setup: Setup) -> str:
    count = max(1, setup.devices // setup.per_node)
    if count == 1:
        return '["127.0.0.1"]'
    return "[" + ", ".join(f'"{PLACEHOLDER_NODES}{i + 1}"' for i in range(count)) + "]"


# the loss weight of imported multi-token prediction modules: DeepSeek-V3's for the
# last 4.8T of its 14.8T tokens (0.3 before; arXiv 2412.19437, section 4.2), which
# continued pre-training of its weights carries on, and Megatron-LM's default
MTP_WEIGHT = 0.1


def _mtp(m: HfModel) -> str:
    """The train block's `mtp` line for the checkpoint's multi-token prediction layers:
    each module runs a copy of the network's last layer kind (the default `layer`)."""
    return f"    mtp          = mtp(depth = {m.mtp}, weight = {MTP_WEIGHT})\n" if m.mtp else ""


def spec_text(m: HfModel, setup: Setup, source: str) -> str:
    """The spec for `m` run as `setup`, unformatted; `source` names the config."""
    head_dim = "hidden / heads" if m.head_dim_is_derived else str(m.head_dim)
    heads = f"    heads    = {m.heads}\n"
    if m.mla is None:  # mla's head sizes are its arguments
        heads += f"    kv_heads = {m.kv_heads}\n    head_dim = {head_dim}\n"
    window = f"    window   = {m.window}\n" if m.window is not None else ""
    found = runs(m)
    kinds = [_layer(m, run) for run in found]
    ffn = f"    ffn      = {m.ffn}\n" if any(not r.sparse for r in found) else ""
    if m.moe is not None:
        ffn += f"    moe_ffn  = {m.moe.ffn}\n"
    if m.moe is not None and m.moe.shared_ffn:
        ffn += f"    shared_ffn = {m.moe.shared_ffn}\n"
    if m.tied:
        logits = "    logits = linear(norm, vocab, tie = emb)\n"
    else:
        logits = "    logits = linear(norm, vocab, bias = false) weight @ [1, tp]\n"
    recompute = "".join(f"    {run.kind} = full\n" for run in found)
    per_node = min(setup.devices, setup.per_node)
    micro_batches = setup.global_batch // setup.dp
    ep = "    ep = 1\n" if m.moe is not None else ""
    counted = f"{m.params:,} parameters"
    if m.mtp:  # transformers' count, which has no multi-token prediction layer
        counted += f" without its {m.mtp} multi-token prediction layer{'s' if m.mtp > 1 else ''}"
    return f"""# {setup.name}: imported from {source} ({m.family} family, {counted}).
# The cluster addresses are placeholders until you name your servers.
msl 0.1

model {setup.name} {{
    vocab    = {m.vocab}
    hidden   = {m.hidden}
{heads}{ffn}    layers   = {m.layers}
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
{ep}}}
{''.join(kinds)}
network {{
    input tokens : [batch, seq] @ [dp, 1]
    emb    = embedding(tokens, vocab, hidden) table @ [tp, 1]
{_body(found)}    norm   = rmsnorm(body, eps = {m.eps!r})
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
{_mtp(m)}}}
"""
