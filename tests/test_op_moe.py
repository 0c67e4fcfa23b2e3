"""moe (msgen/ops/moe.py): its numpy reference, written token by token from the
published definitions (Megatron-LM megatron/core/transformer/moe/moe_utils.py
`topk_softmax_with_capacity`, `switch_load_balancing_loss_func`, `z_loss_func`;
Fedus et al. 2021 for the Switch loss), and what the op's shape, parameters, saves
and FLOPs must be on tests/specs/tiny_moe.msl."""

from __future__ import annotations

from math import ceil
from pathlib import Path

import numpy as np
import pytest

from msgen.analysis.facts import context
from msgen.analysis.plan import Plan
from msgen.compiler import analyze_text
from msgen.estimate.flops import op_work, step_flops
from msgen.ops import OPS
from tests.oracles import require
from tests.reference_numpy import WithAux
from tests.reference_routing import for_losses, load_balancing_loss, route, sequence_loss

SPEC = Path(__file__).resolve().parent / "specs" / "tiny_moe.msl"


def silu(x):
    return x / (1.0 + np.exp(-x))


def gelu(x):
    from math import erf, sqrt

    return 0.5 * x * (1.0 + np.vectorize(erf)(x / sqrt(2.0)))


def ffn(x, w: dict, act: str, prefix: str = ""):
    """One expert on rows x [n, hidden]: down(silu(x gate) * (x up)), or down(gelu(x up))."""
    up = x @ w[prefix + "up"]
    hidden = silu(x @ w[prefix + "gate"]) * up if act == "swiglu" else gelu(up)
    return hidden @ w[prefix + "down"]


def kept(chosen, weights, experts, capacity, drop, groups=1):
    """Which (token, slot) pairs survive a capacity, GShard's way: the tokens form
    `groups` equal groups in order (one per data-parallel rank), and in each group
    each expert keeps at most ceil(group tokens * k / E * capacity) of its tokens,
    the most probable ("probs", Megatron-LM's drop policy of that name) or the first
    in token order ("position"); dropless (None) keeps all."""
    keep = np.ones(chosen.shape, bool)
    if capacity is None:
        return keep
    n, k = chosen.shape
    size = n // groups
    cap = ceil(size * k / experts * capacity)
    for start in range(0, n, size):
        for e in range(experts):
            tok, slot = np.nonzero(chosen[start : start + size] == e)
            if drop == "probs":
                order = np.argsort(-weights[start + tok, slot], kind="stable")
            else:
                order = np.arange(len(tok))
            drop_ = order[cap:]
            keep[start + tok[drop_], slot[drop_]] = False
    return keep


def moe(x, params: dict, experts, top_k, act="swiglu", score="softmax", norm_topk=True,
        capacity=None, drop="probs", groups=1, **routing):  # fmt: skip
    """x [..., hidden]; params: router [h, E], gate/up [E, h, F], down [E, F, h], and
    shared_gate/shared_up [h, S], shared_down [S, h] when there are shared experts,
    their sigmoid gate shared_sigmoid [h, 1] when they have one, the correction bias
    expert_bias [E] when the router has one; `routing`: the other options of
    tests/reference_routing.py `route`."""
    h = x.shape[-1]
    t = x.reshape(-1, h)
    bias = params.get("expert_bias")
    _, chosen, weights = route(t, params["router"], top_k, score, norm_topk, bias, **routing)
    keep = kept(chosen, weights, experts, capacity, drop, groups)
    out = np.zeros_like(t)
    for i in range(t.shape[0]):
        for j in range(top_k):
            if keep[i, j]:
                e = chosen[i, j]
                w = {m: params[m][e] for m in ("gate", "up", "down") if m in params}
                out[i] += weights[i, j] * ffn(t[i : i + 1], w, act)[0]
    if "shared_up" in params:
        shared = ffn(t, params, act, "shared_")
        if "shared_sigmoid" in params:  # Qwen2-MoE's shared_expert_gate [h, 1]
            shared = shared / (1.0 + np.exp(-(t @ params["shared_sigmoid"])))
        out += shared
    return out.reshape(x.shape)


def z_loss(logits, coeff):
    """ST-MoE's router z-loss, Megatron's z_loss_func: coeff * mean(logsumexp^2)."""
    m = logits.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(logits - m).sum(-1, keepdims=True)))[:, 0]
    return coeff * float(np.mean(lse**2))


def aux_losses(x, params, top_k, score, coeffs, seq, **routing) -> float:
    """The op's auxiliary losses on tokens x [..., hidden]: Switch's load-balancing
    loss and DeepSeek-V3's sequence-wise one over the probabilities (sigmoid scores
    normalised per token first, as Megatron-LM's router does for the losses) and the
    copies routed before any capacity drops, and the router z-loss of the logits."""
    t = x.reshape(-1, x.shape[-1])
    router = params["router"]
    s, chosen, _ = route(t, router, top_k, score, False, params.get("expert_bias"), **routing)
    probs, experts = for_losses(s, score), router.shape[1]
    aux_coeff, seq_coeff, z_coeff = coeffs
    return (
        load_balancing_loss(probs, chosen, experts, aux_coeff)
        + sequence_loss(probs, chosen, experts, seq, seq_coeff)
        + z_loss(t @ router, z_coeff)
    )


def reference(op):
    a = op.args
    names = ("router", "gate", "up", "down", "shared_gate", "shared_up", "shared_down",
             "shared_sigmoid", "expert_bias")  # fmt: skip
    params = {m: op.params[f"{op.prefix}{op.node.name}.{m}"] for m in names
              if f"{op.prefix}{op.node.name}.{m}" in op.params}  # fmt: skip
    score = a.get("router", "softmax")
    groups = a.get("expert_groups", 1)
    routing = {
        "expert_groups": groups,
        "top_groups": a.get("top_groups", groups),
        "group_score": a.get("group_score", "top2"),
    }
    out = moe(
        op.inputs[0],
        params,
        a["experts"],
        a["top_k"],
        a.get("activation", "swiglu"),
        score,
        a.get("norm_topk", True),
        a.get("capacity"),
        a.get("drop", "probs"),
        op.ctx.mesh_sizes["dp"],
        scaling=a.get("routed_scaling", 1.0),
        **routing,
    )
    coeffs = (a.get("aux_loss", 0.0), a.get("seq_aux_loss", 0.0), a.get("z_loss", 0.0))
    if not any(coeffs):
        return out
    seq = op.inputs[0].shape[-2]
    return WithAux(out, aux_losses(op.inputs[0], params, a["top_k"], score, coeffs, seq, **routing))


REFERENCES = {"moe": reference}


def weights(rng, h, e, f, s=0):
    p = {
        "router": rng.normal(size=(h, e)),
        "gate": rng.normal(size=(e, h, f)) / h**0.5,
        "up": rng.normal(size=(e, h, f)) / h**0.5,
        "down": rng.normal(size=(e, f, h)) / f**0.5,
    }
    if s:
        p |= {"shared_gate": rng.normal(size=(h, s)), "shared_up": rng.normal(size=(h, s)),
              "shared_down": rng.normal(size=(s, h))}  # fmt: skip
    return p


def test_all_experts_equal_and_normalised_is_one_dense_ffn():
    """With every expert the same, normalised top-k weights sum to one: the block
    is that one feed-forward, whatever the router chooses."""
    rng = np.random.default_rng(0)
    p = weights(rng, 8, 4, 6)
    for m in ("gate", "up", "down"):
        p[m] = np.repeat(p[m][:1], 4, axis=0)
    x = rng.normal(size=(2, 5, 8))
    dense = ffn(x.reshape(-1, 8), {m: p[m][0] for m in ("gate", "up", "down")}, "swiglu")
    np.testing.assert_allclose(moe(x, p, 4, 2), dense.reshape(x.shape), rtol=1e-12)
    unnormalised = moe(x, p, 4, 2, norm_topk=False)
    assert np.abs(unnormalised - dense.reshape(x.shape)).max() > 1e-3


def test_top_1_sends_each_token_to_its_highest_scoring_expert_only():
    rng = np.random.default_rng(1)
    p = weights(rng, 8, 4, 6)
    x = rng.normal(size=(6, 8))
    best = np.argmax(x @ p["router"], -1)
    got = moe(x, p, 4, 1)
    for i in range(6):
        one = {m: p[m][best[i]] for m in ("gate", "up", "down")}
        np.testing.assert_allclose(got[i], ffn(x[i : i + 1], one, "swiglu")[0], rtol=1e-12)


def test_capacity_drops_the_least_probable_or_the_latest_tokens():
    """Capacity 1 with every token choosing expert 0 (top 1 of 2): ceil(n / 2)
    tokens stay, by probability or by position."""
    rng = np.random.default_rng(2)
    p = weights(rng, 4, 2, 3)
    x = np.abs(rng.normal(size=(6, 4))) + 0.1
    p["router"] = np.stack([np.ones(4), -np.ones(4)], axis=1) * rng.uniform(0.5, 2, (4, 1))
    probs, chosen, w = route(x, p["router"], 1, norm_topk=False)
    assert (chosen == 0).all()
    by_probs = kept(chosen, probs[:, :1], 2, 1.0, "probs")[:, 0]
    assert by_probs.sum() == 3 and set(np.argsort(-probs[:, 0])[:3]) == set(np.nonzero(by_probs)[0])
    assert kept(chosen, w, 2, 1.0, "position")[:, 0].tolist() == [True] * 3 + [False] * 3
    out = moe(x, p, 2, 1, capacity=1.0, drop="position")
    np.testing.assert_allclose(out[3:], 0.0)
    assert np.abs(out[:3]).min() > 0


def test_the_load_balancing_loss_is_its_coefficient_when_routing_is_uniform():
    """P_e = 1/E and f_e = 1/E give coeff * E * E / E^2 = coeff (Fedus et al. 2021);
    all tokens on one expert with probability one give coeff * E."""
    n, e = 8, 4
    probs = np.full((n, e), 1 / e)
    chosen = np.array([[i % e, (i + 1) % e] for i in range(n)])
    assert abs(load_balancing_loss(probs, chosen, e, 0.01) - 0.01) < 1e-15
    peaked = np.zeros((n, e))
    peaked[:, 0] = 1
    assert abs(load_balancing_loss(peaked, np.zeros((n, 1), int), e, 0.01) - 0.04) < 1e-15
    assert abs(z_loss(np.zeros((3, e)), 1.0) - np.log(e) ** 2) < 1e-12


def analysed(ep: int = 1, moe_args: str = ""):
    text = SPEC.read_text().replace("    tp = 2\n}", f"    tp = 2\n    ep = {ep}\n}}")
    text = text.replace("aux_loss = 0.01", moe_args + "aux_loss = 0.01")
    result = analyze_text(text, "spec.msl", SPEC.parent)
    assert result.ok, [d.message for d in result.diagnostics]
    return result


def test_moe_parameters_are_the_router_and_the_stacked_experts():
    """router [h, E]; gate, up [E, h, F] and down [E, F, h]; the shared expert's
    [h, S], [h, S], [S, h]: the spec's 64 hidden, 4 experts, ffn 32, shared 32. The
    experts split over ep on their first dim when ep > 1, and over tp on ffn with a
    capacity (dropless whole: each tp rank takes tokens of its own); the shared
    experts over tp either way."""
    of = analysed().facts.graphs["decoder"].ops["ffn2"]
    shapes = {p.name: p.shape for p in of.params}
    assert shapes == {
        "router": (64, 4),
        "gate": (4, 64, 32),
        "up": (4, 64, 32),
        "down": (4, 32, 64),
        "shared_gate": (64, 32),
        "shared_up": (64, 32),
        "shared_down": (32, 64),
    }
    splits = {p.name: p.split for p in of.params}
    assert splits["router"] == ((), ())
    assert splits["gate"] == splits["down"] == ((), (), ())
    assert splits["shared_up"] == ((), ("tp",))
    of = analysed(ep=2).facts.graphs["decoder"].ops["ffn2"]
    splits = {p.name: p.split for p in of.params}
    assert splits["gate"] == splits["down"] == (("ep",), (), ())
    of = analysed(ep=2, moe_args="capacity = 1.0, ").facts.graphs["decoder"].ops["ffn2"]
    splits = {p.name: p.split for p in of.params}
    assert splits["gate"] == (("ep",), (), ("tp",)) and splits["down"] == (("ep",), ("tp",), ())
    assert splits["router"] == ((), ()) and splits["shared_up"] == ((), ("tp",))


def test_moe_saves_router_probabilities_token_copies_and_expert_buffers():
    """Per micro-batch (batch = micro_batch * dp = 4, seq 32: n = 128 tokens, k = 2,
    h = 64, F = S = 32): x; fp32 probs [n, E]; top-k weights (fp32) and indices
    (int32) [n, k]; permuted copies and expert outputs [n k, h]; gate, up and act
    [n k, F]; the shared expert's gate, up and act [n, S]."""
    of = analysed().facts.graphs["decoder"].ops["ffn2"]
    got = {s.key: (s.shape, s.itemsize) for s in of.saves}
    n, k = 128, 2
    assert got == {
        "n2": ((4, 32, 64), 4),
        "ffn2.probs": ((n, 4), 4),
        "ffn2.topk_weights": ((n, k), 4),
        "ffn2.topk_indices": ((n, k), 4),
        "ffn2.permuted": ((n * k, 64), 4),
        "ffn2.gate": ((n * k, 32), 4),
        "ffn2.up": ((n * k, 32), 4),
        "ffn2.act": ((n * k, 32), 4),
        "ffn2.expert_out": ((n * k, 64), 4),
        "ffn2.shared_gate": ((n, 32), 4),
        "ffn2.shared_up": ((n, 32), 4),
        "ffn2.shared_act": ((n, 32), 4),
    }


def test_moe_flops_count_the_router_and_the_active_experts_only():
    """The step's model FLOPs less those of the same spec without the moe line
    (output h + n2) are the moe's: 3 x forward (fwd + 2 x bwd) x layers x
    micro-batches x [router 2 n h E + experts 3 * 2 n k h F + shared 3 * 2 n h S]."""
    text = SPEC.read_text()
    moe_ = analysed()
    with_moe = step_flops(Plan(moe_.spec, moe_.facts)).model
    line = next(t for t in text.splitlines(keepends=True) if "= moe(" in t)
    text = text.replace(line, "").replace("output h + ffn2", "output h + n2")
    dense = analyze_text(text, "s.msl", SPEC.parent)
    without = step_flops(Plan(dense.spec, dense.facts)).model
    n, h, e, k, f, s = 128, 64, 4, 2, 32, 32
    per = 2 * n * h * e + 3 * 2 * n * k * h * f + 3 * 2 * n * h * s
    assert with_moe - without == 3 * 2 * 2 * per


def errors_of(text: str):
    result = analyze_text(text, "spec.msl", SPEC.parent)
    return [(d.code, d.message) for d in result.diagnostics if d.is_error]


def test_a_router_that_is_not_one_of_the_choices_is_msl116():
    text = SPEC.read_text().replace("aux_loss = 0.01", "router = relu, aux_loss = 0.01")
    assert errors_of(text) == [("MSL116", "`router` of moe is one of softmax, sigmoid")]


def test_a_split_router_is_msl210():
    text = SPEC.read_text().replace("aux_loss = 0.01)", "aux_loss = 0.01) router @ [1, tp]")
    (error,) = errors_of(text)
    assert error[0] == "MSL210" and "`router` of moe `ffn2` cannot be split" in error[1]


def test_a_dropless_expert_split_over_tp_is_msl210_and_with_a_capacity_is_kept():
    """The dropless Morph region lays the experts over ep only: a declared ffn split
    would be a layout the generated code does not run."""
    split = "aux_loss = 0.01) gate @ [1, 1, tp]"
    (error,) = errors_of(SPEC.read_text().replace("aux_loss = 0.01)", split))
    assert error[0] == "MSL210" and "`gate` of dropless moe `ffn2`" in error[1]
    text = SPEC.read_text().replace("aux_loss = 0.01)", "capacity = 1.0, " + split)
    assert errors_of(text) == []


def with_ep(moe_args: str, split: str = "") -> str:
    """tiny_moe with ep = 2 inside dp = 4, tp = 2, the moe given `moe_args` and `split`."""
    text = SPEC.read_text().replace("    tp = 2\n}", "    tp = 2\n    ep = 2\n}")
    return text.replace("aux_loss = 0.01)", f"{moe_args}aux_loss = 0.01) {split}")


def test_the_experts_batched_matmuls_split_experts_over_ep_and_ffn_over_tp():
    """With a capacity, ep 2 and tp 2, by hand: the experts' first batched matmul takes
    gate (and up) [experts, hidden, ffn] laid (ep, None, tp), the second down
    [experts, ffn, hidden] (ep, tp, None) (Megatron-LM's expert tensor parallelism =
    tp, the default), the tokens [experts, slots, hidden] (ep, edp, None) and the
    activation (ep, edp, tp): tensor maps of a Layout over the stage's [dp / ep, ep,
    tp] devices, whose slices are those of the layout the estimate and plan.json read."""
    result = analyze_text(with_ep("capacity = 1.0, "), "spec.msl", SPEC.parent)
    of = result.facts.graphs["decoder"].ops["ffn2"]
    strategies = dict(OPS["moe"].strategies(of.node, of.layout, context(result.spec)))
    assert strategies == {
        "inner": (("ep", "edp", "None"), ("ep", "None", "tp")),
        "outer": (("ep", "edp", "tp"), ("ep", "tp", "None")),
        # the tokens over dp 4; the router whole, the shared experts as `linear`'s
        "router": ((4, 1), (1, 1)),
        "shared_gate": ((4, 1), (1, 2)),
        "shared_up": ((4, 1), (1, 2)),
        "shared_down": ((4, 2), (2, 1)),
    }
    splits = {p.name: p.split for p in of.layout.params}
    assert splits["gate"] == splits["up"] == (("ep",), (), ("tp",))
    assert splits["down"] == (("ep",), ("tp",), ())


# Declared splits of the stacked experts, tiny_moe with ep 2 (dp 4, tp 2): the one the
# generated code runs (with a capacity experts over ep and ffn over tp, as above;
# dropless each expert whole, the Morph region's (ep, None, None)) is accepted, any other
# refused, since the strategy file and the estimate would describe slices the ranks do
# not hold: MSL210 naming the code's split.
EXPERT_SPLITS = [
    ("capacity = 1.0, ", "gate @ [ep, 1, tp]", None),
    ("capacity = 1.0, ", "down @ [ep, tp, 1]", None),
    ("capacity = 1.0, ", "gate @ [dp, 1, tp]", "[ep, 1, tp]"),
    ("capacity = 1.0, ", "up @ [ep, 1, 1]", "[ep, 1, tp]"),
    ("capacity = 1.0, ", "up @ [1, 1, tp]", "[ep, 1, tp]"),
    ("capacity = 1.0, ", "down @ [ep, 1, tp]", "[ep, tp, 1]"),
    ("", "gate @ [ep, 1, 1]", None),
    ("", "down @ [ep, 1, 1]", None),
    ("", "gate @ [ep, 1, tp]", "[ep, 1, 1]"),
    ("", "down @ [dp, 1, 1]", "[ep, 1, 1]"),
]


@pytest.mark.parametrize("moe_args, split, code_split", EXPERT_SPLITS)
def test_a_declared_expert_split_must_be_the_one_the_code_runs(moe_args, split, code_split):
    errors = errors_of(with_ep(moe_args, split))
    if code_split is None:
        assert errors == []
        return
    ((code, message),) = errors
    name = split.split()[0]
    assert code == "MSL210" and message.startswith(f"`{name}` of ")
    assert f"is split {split.split('@ ')[1]}, but the generated code splits it {code_split}" in (
        message
    )


def test_an_axis_of_size_one_in_a_declared_expert_split_splits_nothing():
    """tiny_moe's ep is 1: `gate @ [ep, 1, tp]` is the code's split, [1, 1, tp]."""
    one = SPEC.read_text().replace("aux_loss = 0.01)", "capacity = 1.0) gate @ [ep, 1, tp]")
    assert errors_of(one) == []


def test_capacity_work_counts_every_groups_padded_slots_and_the_dispatch():
    """capacity 0.45 on tiny_moe (dp 4: 4 groups of 32 of the 128 tokens, h 64, 4
    experts, top 2, F = S = 32): each expert's slots per group ceil(32 x 2 / 4 x 0.45)
    = ceil(7.2) = 8, 4 x 4 x 8 = 128 rows; kernels: router 2 n h E, experts
    3 x 2 x 128 h F, dispatch and combine 2 x 2 x 128 x 32 h, shared 3 x 2 n h S;
    the memory-bound bytes over the 128 slots' rows, not the 256 routed copies."""
    text = SPEC.read_text().replace("aux_loss = 0.01", "capacity = 0.45, aux_loss = 0.01")
    result = analyze_text(text, "moe.msl", SPEC.parent)
    of = result.facts.graphs["decoder"].ops["ffn2"]
    n, h, e, f, s, rows = 128, 64, 4, 32, 32, 128
    want = 2 * n * h * e + 3 * 2 * rows * h * f + 2 * 2 * rows * 32 * h + 3 * 2 * n * h * s
    work = op_work(of, context(result.spec))
    assert work.kernel_flops == want
    # memory-bound fp32 bytes: x and y, the router's probabilities written and read,
    # the 128 slots' rows of h read and written twice, the activation over them, and
    # the shared expert's
    rows_bytes = 4 * rows * h + 3 * rows * f
    want = 4 * (2 * n * h + 2 * n * e + rows_bytes + 2 * n * s)
    assert work.memory_bytes == want


@pytest.mark.parametrize("norm_topk", [True, False])
def test_the_reference_equals_transformers_qwen3_moe_block(norm_topk):
    """The reference against Qwen3-MoE's own block (transformers'
    modeling_qwen3_moe.Qwen3MoeSparseMoeBlock: softmax over all experts in fp32, top k,
    renormalised with norm_topk_prob, each expert down(silu(gate x) * up x)), its
    weights laid out as msgen's ([out, in] there, [in, out] stacked here); and Switch's
    loss against its load_balancing_loss_func, which divides each top-k slot's counts
    by n where Megatron-LM divides all n k copies' by n k: top_k times the reference's
    at coefficient 1."""
    torch = require("torch")
    transformers = require("transformers")
    from transformers.models.qwen3_moe import modeling_qwen3_moe

    h, e, k, f = 16, 4, 2, 8
    config = transformers.Qwen3MoeConfig(
        hidden_size=h, moe_intermediate_size=f, num_experts=e, num_experts_per_tok=k,
        norm_topk_prob=norm_topk, hidden_act="silu",
    )  # fmt: skip
    torch.manual_seed(0)
    block = modeling_qwen3_moe.Qwen3MoeSparseMoeBlock(config).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.5)
    x = torch.randn(2, 5, h)
    with torch.no_grad():
        want, logits = block(x)

    def stacked(name):  # experts' [out, in] weights as [E, in, out]
        return np.stack([getattr(m, name).weight.detach().numpy().T for m in block.experts])

    params = {"router": block.gate.weight.detach().numpy().T.astype(np.float64)}
    params |= {m: stacked(f"{m}_proj").astype(np.float64) for m in ("gate", "up", "down")}
    got = moe(x.numpy().astype(np.float64), params, e, k, norm_topk=norm_topk)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)

    tokens = x.numpy().reshape(-1, h).astype(np.float64)
    probs, chosen, _ = route(tokens, params["router"], k, norm_topk=False)
    theirs = modeling_qwen3_moe.load_balancing_loss_func((logits,), e, k)
    assert abs(k * load_balancing_loss(probs, chosen, e, 1.0) - float(theirs)) < 1e-5
