"""An independent forward pass in numpy, written from msgen's IR (not from the
generated code): the oracle the generated MindSpore model is compared against.

Dropout is the identity (evaluation). Parameters come in by their spec paths.
"""

from __future__ import annotations

import math

import numpy as np

from msgen.analysis.plan import Plan
from msgen.ops.attention import head_dim, kv_heads


def layernorm(x, gamma, beta, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def rmsnorm(x, gamma, eps):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * gamma


def gelu(x, approximate):
    if approximate:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def silu(x):
    return x / (1 + np.exp(-x))


def rope(x, theta=10000.0):
    """Rotate-half rotary embedding of x [batch, heads, seq, head_dim]."""
    seq, hd = x.shape[-2], x.shape[-1]
    inv_freq = theta ** (-np.arange(0, hd, 2) / hd)
    angles = np.outer(np.arange(seq), inv_freq)
    angles = np.concatenate([angles, angles], axis=-1)
    half = hd // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * np.cos(angles) + rotated * np.sin(angles)


def attention(qkv, heads, groups, hd, causal, use_rope, theta=10000.0, window=None):
    """qkv laid out per kv group: the group's query heads, then its k, then its v;
    `window`: each position sees itself and the window - 1 before it."""
    b, s, _ = qkv.shape
    per = heads // groups
    t = qkv.reshape(b, s, groups, per + 2, hd)
    q = t[:, :, :, :per, :].reshape(b, s, heads, hd).transpose(0, 2, 1, 3)
    k = t[:, :, :, per, :].transpose(0, 2, 1, 3)  # [b, groups, s, hd]
    v = t[:, :, :, per + 1, :].transpose(0, 2, 1, 3)
    if use_rope:
        q, k = rope(q, theta), rope(k, theta)
    k = np.repeat(k, per, axis=1)  # query head h uses group h // per
    v = np.repeat(v, per, axis=1)
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd)
    if causal:
        seen = np.tril(np.ones((s, s), bool))
        if window:
            seen &= ~np.tril(np.ones((s, s), bool), -window)
        scores = np.where(seen, scores, -np.inf)
    scores = scores - scores.max(-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(-1, keepdims=True)
    out = probs @ v  # [b, heads, s, hd]
    return out.transpose(0, 2, 1, 3).reshape(b, s, heads * hd)


def cross_entropy(logits, labels):
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
    return -picked.mean()


def run_graph(plan: Plan, graph: str, x, params: dict, prefix: str, labels, ctx):
    facts = plan.graph(graph)
    values = {facts.graph.input.name: x}
    for name, of in facts.ops.items():
        node = of.node
        args = node.args
        ins = [values[r.name] for r in node.inputs]

        def p(pname, name=name):
            return params[f"{prefix}{name}.{pname}"]

        kind = node.kind
        if kind == "embedding":
            out = p("table")[ins[0]]
        elif kind == "positions":
            out = p("table")
        elif kind == "linear":
            if args.get("tie"):
                out = ins[0] @ params[f"{prefix}{args['tie']}.table"].T
            else:
                out = ins[0] @ p("weight")
                if args.get("bias", True):
                    out = out + p("bias")
        elif kind == "layernorm":
            out = layernorm(ins[0], p("gamma"), p("beta"), args.get("eps", 1e-5))
        elif kind == "rmsnorm":
            out = rmsnorm(ins[0], p("gamma"), args.get("eps", 1e-6))
        elif kind == "gelu":
            out = gelu(ins[0], args.get("approximate", False))
        elif kind == "silu":
            out = silu(ins[0])
        elif kind == "swiglu":
            gate, up = np.split(ins[0], 2, axis=-1)
            out = silu(gate) * up
        elif kind == "geglu":
            gate, up = np.split(ins[0], 2, axis=-1)
            out = gelu(gate, approximate=False) * up
        elif kind == "dropout":
            out = ins[0]
        elif kind in ("add", "mul"):
            operands = ins + ([args["const"]] if "const" in args else [])
            out = operands[0] + operands[1] if kind == "add" else operands[0] * operands[1]
        elif kind == "attention":
            out = attention(
                ins[0],
                args["heads"],
                kv_heads(node),
                head_dim(node, ctx),
                args.get("causal", False),
                args.get("rope", False),
                args.get("rope_theta", 10000.0),
                args.get("window"),
            )
        elif kind == "cross_entropy":
            out = cross_entropy(ins[0], labels)
        elif kind == "repeat":
            out = ins[0]
            for i in range(args["count"]):
                out = run_graph(
                    plan, args["layer"], out, params, f"{args['layer']}.{i}.", None, ctx
                )
        else:
            raise NotImplementedError(kind)
        values[name] = out
    return values[facts.graph.output]


def forward_loss(plan: Plan, params: dict, tokens, labels) -> float:
    """The network's loss on `tokens` [batch, seq] against `labels`, in float64."""
    from msgen.analysis.facts import context

    params = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
    return float(run_graph(plan, "network", tokens, params, "", labels, context(plan.spec)))
