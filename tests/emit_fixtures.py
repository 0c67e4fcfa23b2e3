"""Hand-built render contexts: what build_context(plan) must produce for two tiny specs.

(a) `tiny_gpt`: the DESIGN.md example at toy size: layernorm, exact gelu,
    dropout 0.1, learned positions, output layer tied to the embedding.
(b) `tiny_llama`: rmsnorm, grouped-query attention (4 heads, 2 kv heads), rope,
    silu(gate) * up, no biases, untied output layer.
Both on dp = 2, tp = 2, pp = 2 with Megatron-style strategies: qkv/up/gate
column parallel over tp, proj/down row parallel, attention heads over tp,
vocab-parallel embedding.
"""

from __future__ import annotations

from dataclasses import replace
from fnmatch import fnmatch

from msgen.emit.context import (
    LayerSpec,
    ModelContext,
    NetworkSpec,
    OpSpec,
    ParamSpec,
    TrainSpec,
)

DP, TP, PP = 2, 2, 2
VOCAB, HIDDEN, HEADS, SEQ, LAYERS = 256, 64, 4, 32, 2
HEAD_DIM = HIDDEN // HEADS

ROW = (DP, 1, 1)  # [batch, seq, hidden], whole per replica
COL = (DP, 1, TP)  # [batch, seq, n], last dim split over tp


def weight(*shape: int) -> ParamSpec:
    return ParamSpec("weight", shape, "normal", True)


def bias(n: int) -> ParamSpec:
    return ParamSpec("bias", (n,), "zeros", False)


def column(name: str, x: str, n_in: int, n_out: int, with_bias: bool = True) -> OpSpec:
    """Column-parallel linear: weight [in, out] split on out, output split on its last dim."""
    strategies = [("matmul", ((DP, 1), (1, TP)))]
    params = [weight(n_in, n_out)]
    if with_bias:
        strategies.append(("bias", ((DP, TP), (TP,))))
        params.append(bias(n_out))
    return OpSpec(
        name, "linear", (x,), tuple(params), tuple(strategies), n_out=n_out, bias=with_bias
    )


def row(name: str, x: str, n_in: int, n_out: int, with_bias: bool = True) -> OpSpec:
    """Row-parallel linear: weight split on in (an AllReduce after), output whole."""
    strategies = [("matmul", ((DP, TP), (TP, 1)))]
    params = [weight(n_in, n_out)]
    if with_bias:
        strategies.append(("bias", ((DP, 1), (1,))))
        params.append(bias(n_out))
    return OpSpec(
        name, "linear", (x,), tuple(params), tuple(strategies), n_out=n_out, bias=with_bias
    )


def layernorm(name: str, x: str, stage: int = 0) -> OpSpec:
    params = (
        ParamSpec("gamma", (HIDDEN,), "ones", False),
        ParamSpec("beta", (HIDDEN,), "zeros", False),
    )
    return OpSpec(
        name, "layernorm", (x,), params, (("norm", (ROW, (1,), (1,))),), eps=1e-5, stage=stage
    )


def rmsnorm(name: str, x: str, stage: int = 0) -> OpSpec:
    params = (ParamSpec("gamma", (HIDDEN,), "ones", False),)
    return OpSpec(name, "rmsnorm", (x,), params, (("norm", (ROW,)),), eps=1e-6, stage=stage)


def add(name: str, a: str, b: str, strategy=(ROW, ROW), stage: int = 0) -> OpSpec:
    return OpSpec(name, "add", (a, b), strategies=(("x", strategy),), stage=stage)


def attention(x: str, kv_heads: int, *, rope: bool, p: float) -> OpSpec:
    return OpSpec(
        "att",
        "attention",
        (x,),
        strategies=(("scores", ((DP, TP, 1, 1), (DP, TP, 1, 1))),),
        heads=HEADS,
        kv_heads=kv_heads,
        head_dim=HEAD_DIM,
        causal=True,
        rope=rope,
        p=p,
    )


def fusion(params: tuple[tuple[str, tuple[int, ...]], ...]) -> tuple[tuple[str, int], ...]:
    """`allreduce small = ["*.ln*", "*.bias"]` then `allreduce decoder = ["decoder.*"] buckets 2`."""
    out = []
    for path, _ in params:
        if fnmatch(path, "*.ln*") or fnmatch(path, "*.bias"):
            out.append((path, 2))
        elif fnmatch(path, "decoder.*"):
            out.append((path, 3 + int(path.split(".")[1])))
    return tuple(out)


def train(**overrides) -> TrainSpec:
    settings = dict(
        micro_batch=1,
        global_batch=DP * 4,
        lr=3e-3,
        beta1=0.9,
        beta2=0.95,
        eps=1e-8,
        weight_decay=0.1,
        warmup=3,
        steps=200,
        min_lr=3e-4,
        grad_clip=1.0,
        checkpoint_every=10,
        checkpoint_keep=2,
        seed=1234,
    )
    settings.update(overrides)
    return TrainSpec(**settings)


def network(layer: str, head: tuple[OpSpec, ...], tail: tuple[OpSpec, ...]) -> NetworkSpec:
    body = OpSpec("body", "repeat", (head[-1].name,), layer=layer, count=LAYERS, stages=(0, 1))
    return NetworkSpec("tokens", tail[-1].name, (*head, body, *tail))


def tiny_gpt() -> ModelContext:
    ffn = 4 * HIDDEN
    decoder = LayerSpec(
        "decoder",
        "x",
        "out",
        (
            layernorm("ln1", "x"),
            column("qkv", "ln1", HIDDEN, 3 * HIDDEN),
            attention("qkv", HEADS, rope=False, p=0.0),
            row("proj", "att", HIDDEN, HIDDEN),
            OpSpec("d1", "dropout", ("proj",), strategies=(("x", (ROW,)),), p=0.1),
            add("h", "x", "d1"),
            layernorm("ln2", "h"),
            column("up", "ln2", HIDDEN, ffn),
            OpSpec("act", "gelu", ("up",), strategies=(("x", (COL,)),)),
            row("down", "act", ffn, HIDDEN),
            OpSpec("d2", "dropout", ("down",), strategies=(("x", (ROW,)),), p=0.1),
            add("out", "h", "d2"),
        ),
        recompute=True,
    )
    emb = OpSpec(
        "emb",
        "embedding",
        ("tokens",),
        (ParamSpec("table", (VOCAB, HIDDEN), "normal", True),),
        (("gather", ((TP, 1), (DP, 1))),),
    )
    pos = OpSpec("pos", "positions", (), (ParamSpec("table", (SEQ, HIDDEN), "normal", True),))
    last = PP - 1
    net = network(
        "decoder",
        (emb, pos, add("x", "emb", "pos", (ROW, (1, 1)))),
        (
            layernorm("norm", "body", stage=last),
            OpSpec(
                "logits",
                "linear",
                ("norm",),
                strategies=(("matmul", ((DP, 1), (TP, 1))),),
                tie="emb",
                stage=last,
            ),
            OpSpec(
                "loss",
                "cross_entropy",
                ("logits", "tokens"),
                strategies=(("logits", ((DP, 1),)),),
                stage=last,
            ),
        ),
    )
    ctx = ModelContext(
        name="tiny_gpt",
        spec_path="specs/tiny_gpt.msl",
        spec_sha256="0" * 64,
        dtype="fp32",
        param_dtype="fp32",
        vocab=VOCAB,
        seq=SEQ,
        dp=DP,
        tp=TP,
        pp=PP,
        micro_batches=4,
        schedule="1f1b",
        layers=(decoder,),
        network=net,
        train=train(zero=1, loss_scale="dynamic"),
    )
    return replace(ctx, fusion=fusion(ctx.parameters()))


def tiny_llama() -> ModelContext:
    ffn, kv_heads = 128, 2
    decoder = LayerSpec(
        "decoder",
        "x",
        "out",
        (
            rmsnorm("ln1", "x"),
            column("qkv", "ln1", HIDDEN, (HEADS + 2 * kv_heads) * HEAD_DIM, with_bias=False),
            attention("qkv", kv_heads, rope=True, p=0.0),
            row("proj", "att", HIDDEN, HIDDEN, with_bias=False),
            add("h", "x", "proj"),
            rmsnorm("ln2", "h"),
            column("gate", "ln2", HIDDEN, ffn, with_bias=False),
            column("up", "ln2", HIDDEN, ffn, with_bias=False),
            OpSpec("act", "silu", ("gate",), strategies=(("x", (COL,)),), recompute=True),
            OpSpec("prod", "mul", ("act", "up"), strategies=(("x", (COL, COL)),)),
            row("down", "prod", ffn, HIDDEN, with_bias=False),
            add("out", "h", "down"),
        ),
    )
    emb = OpSpec(
        "emb",
        "embedding",
        ("tokens",),
        (ParamSpec("table", (VOCAB, HIDDEN), "normal", True),),
        (("gather", ((TP, 1), (DP, 1))),),
    )
    last = PP - 1
    net = network(
        "decoder",
        (emb,),
        (
            rmsnorm("norm", "body", stage=last),
            replace(column("logits", "norm", HIDDEN, VOCAB, with_bias=False), stage=last),
            OpSpec(
                "loss",
                "cross_entropy",
                ("logits", "tokens"),
                strategies=(("logits", ((DP, 1),)),),
                stage=last,
            ),
        ),
    )
    return ModelContext(
        name="tiny_llama",
        spec_path="specs/tiny_llama.msl",
        spec_sha256="1" * 64,
        dtype="fp32",
        param_dtype="fp32",
        vocab=VOCAB,
        seq=SEQ,
        dp=DP,
        tp=TP,
        pp=PP,
        micro_batches=4,
        schedule="1f1b",
        layers=(decoder,),
        network=net,
        train=train(),
    )


def tiny_mixed() -> ModelContext:
    """(c) The remaining code paths: pp = 1 (gradient accumulation), flash attention
    asked for (composed on CPU) with dropout and selective recompute, swiglu, tanh
    gelu, a constant product, an untied output layer with bias, no loss scaling,
    no clipping, no checkpoints."""
    ffn = 128
    decoder = LayerSpec(
        "block",
        "x",
        "out",
        (
            layernorm("ln1", "x"),
            column("qkv", "ln1", HIDDEN, 3 * HIDDEN),
            replace(attention("qkv", HEADS, rope=True, p=0.1), flash=True, recompute=True),
            row("proj", "att", HIDDEN, HIDDEN),
            add("h", "x", "proj"),
            layernorm("ln2", "h"),
            column("gu", "ln2", HIDDEN, 2 * ffn),
            OpSpec("sw", "swiglu", ("gu",), strategies=(("x", (ROW,)),), recompute=True),
            OpSpec(
                "act",
                "gelu",
                ("sw",),
                strategies=(("x", (ROW,)),),
                approximate=True,
                recompute=True,
            ),
            row("down", "act", ffn, HIDDEN),
            OpSpec("half", "mul", ("down", 0.5), strategies=(("x", (ROW, ())),)),
            add("out", "h", "half"),
        ),
    )
    emb = OpSpec(
        "emb",
        "embedding",
        ("tokens",),
        (ParamSpec("table", (VOCAB, HIDDEN), "normal", True),),
        (("gather", ((TP, 1), (DP, 1))),),
    )
    body = OpSpec("body", "repeat", ("emb",), layer="block", count=LAYERS, stages=(0, 0))
    net = NetworkSpec(
        "tokens",
        "loss",
        (
            emb,
            body,
            layernorm("norm", "body"),
            column("logits", "norm", HIDDEN, VOCAB),
            OpSpec(
                "loss", "cross_entropy", ("logits", "tokens"), strategies=(("logits", ((DP, 1),)),)
            ),
        ),
    )
    return ModelContext(
        name="tiny_mixed",
        spec_path="specs/tiny_mixed.msl",
        spec_sha256="2" * 64,
        dtype="fp32",
        param_dtype="fp32",
        vocab=VOCAB,
        seq=SEQ,
        dp=DP,
        tp=TP,
        pp=1,
        micro_batches=2,
        schedule="1f1b",
        layers=(decoder,),
        network=net,
        train=train(global_batch=DP * 2, grad_clip=None, checkpoint_every=None),
    )
