"""moe's DeepSeek routing (msgen/ops/moe_routing.py) against transformers 4.57:
DeepSeek-V3's block (models/deepseek_v3/modeling_deepseek_v3.py `DeepseekV3MoE`, its
router `DeepseekV3TopkRouter`: sigmoid scores, the correction bias
`e_score_correction_bias` for the choice only, 2 of 4 groups by their top-2 sums,
norm_topk_prob, routed_scaling_factor) and DeepSeek-V2's (`DeepseekV2MoE`,
`group_limited_greedy`: softmax, groups by their best score, no renormalisation),
each with random weights and (V3) a random bias, run as the generated cell; the
numpy reference (tests/reference_routing.py) against the same blocks; and the
arguments' checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from msgen.compiler import analyze_text
from tests.oracles import require
from tests.reference_routing import choose, route, scores
from tests.test_moe_shared_sigmoid import first_moe_cell

SPEC = Path(__file__).resolve().parent / "specs" / "tiny_moe.msl"
H, E, K, F, G, M = 64, 8, 2, 32, 4, 2  # hidden, experts, top_k, ffn, groups, kept groups
TOKENS = (4, 8)  # batch, seq


def spec(routing: str, top_k: int = K) -> str:
    """tiny_moe with 8 experts, `top_k` of them, one shared expert of ffn and `routing`."""
    old = "moe(n2, experts = 4, top_k = 2, ffn = ffn, shared_ffn = ffn, aux_loss = 0.01)"
    text = SPEC.read_text()
    assert old in text
    return text.replace(old, f"moe(n2, experts = {E}, top_k = {top_k}, ffn = ffn, shared_ffn = ffn, "
                             f"{routing})")  # fmt: skip


V3 = (
    f"router = sigmoid, expert_bias = true, expert_groups = {G}, top_groups = {M}, "
    "routed_scaling = 2.5"
)
V2 = f"expert_groups = {G}, top_groups = {M}, group_score = max, norm_topk = false, routed_scaling = 2.0"  # noqa: E501


def top_k(version: int) -> int:
    """DeepSeek-V2's groups, scored by their best expert, change the choice of no top 2
    from 2 groups (the second expert's group scores it); of a top 3 they do."""
    return K if version == 3 else 3


def block(version: int):
    """transformers' DeepSeek-V3 (or V2) MoE block of these dims, every weight and the
    correction bias drawn at random."""
    torch = require("torch")
    transformers = require("transformers")
    common = dict(
        hidden_size=H, moe_intermediate_size=F, n_routed_experts=E, n_shared_experts=1,
        num_experts_per_tok=top_k(version), n_group=G, topk_group=M, hidden_act="silu",
    )  # fmt: skip
    torch.manual_seed(version)
    if version == 3:
        from transformers.models.deepseek_v3 import modeling_deepseek_v3 as modeling

        config = transformers.DeepseekV3Config(
            **common, routed_scaling_factor=2.5, norm_topk_prob=True
        )
        moe = modeling.DeepseekV3MoE(config).eval()
    else:
        from transformers.models.deepseek_v2 import modeling_deepseek_v2 as modeling

        config = transformers.DeepseekV2Config(
            **common, routed_scaling_factor=2.0, topk_method="group_limited_greedy"
        )
        moe = modeling.DeepseekV2MoE(config).eval()
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0.0, 0.3)
        if version == 3:
            moe.gate.e_score_correction_bias.normal_(0.0, 0.1)
    return moe


def weights(moe) -> dict[str, np.ndarray]:
    """The block's weights as the moe op holds them: [in, out], the experts stacked."""

    def t(linear):
        return linear.weight.detach().numpy().T

    def stacked(name):
        return np.stack([t(getattr(m, name)) for m in moe.experts])

    out = {"router": moe.gate.weight.detach().numpy().T}
    out |= {m: stacked(f"{m}_proj") for m in ("gate", "up", "down")}
    out |= {f"shared_{m}": t(getattr(moe.shared_experts, f"{m}_proj")) for m in ("gate", "up", "down")}  # fmt: skip # noqa: E501
    if hasattr(moe.gate, "e_score_correction_bias"):
        out["expert_bias"] = moe.gate.e_score_correction_bias.detach().numpy()
    return out


def tokens():
    return np.random.default_rng(5).normal(size=(*TOKENS, H)).astype(np.float32)


def transformers_output(moe, x):
    torch = require("torch")
    with torch.no_grad():
        return moe(torch.from_numpy(x)).numpy()


def held_out(w: dict) -> dict:
    """The cell's own weights: the buffer `expert_load` (zero) besides the block's."""
    return w | ({"expert_load": np.zeros(E)} if "expert_bias" in w else {})


@pytest.mark.parametrize("version, routing", [(3, V3), (2, V2)])
def test_the_generated_cell_equals_transformers_deepseek_block(version, routing, tmp_path):
    """The same weights, the same output (fp32), on tokens where the groups decide:
    without them (every group kept) some token is routed to other experts, and the
    generated cell compiled so no longer equals the block."""
    import mindspore as ms

    moe = block(version)
    w = weights(moe)
    x = tokens()
    want = transformers_output(moe, x)
    k = top_k(version)
    cell = first_moe_cell(spec(routing, k), tmp_path / "grouped", held_out(w))
    got = cell(ms.Tensor(x)).asnumpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())

    flat = x.reshape(-1, H).astype(np.float64)
    s = scores(flat @ w["router"], "sigmoid" if version == 3 else "softmax")
    bias, score = w.get("expert_bias"), "top2" if version == 3 else "max"
    grouped, free = choose(s, k, bias, G, M, score), choose(s, k, bias, G, G, score)
    assert (np.sort(grouped, -1) != np.sort(free, -1)).any(-1).sum() > 0
    ungrouped = routing.replace(f"top_groups = {M}", f"top_groups = {G}")
    cell = first_moe_cell(spec(ungrouped, k), tmp_path / "ungrouped", held_out(w))
    assert np.abs(cell(ms.Tensor(x)).asnumpy() - want).max() > 1e-3


def test_the_correction_bias_changes_the_choice_and_never_the_weights():
    """DeepSeek-V3's router with its random bias: the reference's experts and weights
    are transformers' (DeepseekV3TopkRouter, the same weights); the bias picks other
    experts than the unbiased scores would for some tokens, and the weights are the
    unbiased scores of the chosen experts (the biased ones are not)."""
    torch = require("torch")
    moe = block(3)
    w = weights(moe)
    x = tokens().reshape(-1, H)
    with torch.no_grad():
        idx, wt = moe.gate(torch.from_numpy(x))
    s, chosen, got = route(x.astype(np.float64), w["router"], K, "sigmoid", True,
                           w["expert_bias"], G, M, scaling=2.5)  # fmt: skip
    order = np.argsort(idx.numpy(), -1)
    theirs = np.take_along_axis(idx.numpy(), order, -1)
    mine = np.argsort(chosen, -1)
    np.testing.assert_array_equal(np.take_along_axis(chosen, mine, -1), theirs)
    np.testing.assert_allclose(np.take_along_axis(got, mine, -1),
                               np.take_along_axis(wt.numpy(), order, -1), rtol=1e-5)  # fmt: skip
    unbiased = choose(s, K, None, G, M)
    assert (np.sort(unbiased, -1) != np.sort(chosen, -1)).any()
    biased = np.take_along_axis(s + w["expert_bias"], chosen, -1)
    biased = 2.5 * biased / biased.sum(-1, keepdims=True)
    assert np.abs(biased - got).max() > 1e-3


def errors(routing: str):
    result = analyze_text(spec(routing), "spec.msl", SPEC.parent)
    return [(d.code, d.message, d.hint) for d in result.diagnostics if d.is_error]


@pytest.mark.parametrize(
    "routing, message",
    [
        ("expert_groups = 3", "expert_groups = 3 does not divide experts = 8"),
        ("expert_groups = 4, top_groups = 5", "top_groups = 5 must be between 1 and"),
        ("expert_groups = 8, top_groups = 2", "a group of 1 expert cannot score"),
        ("expert_groups = 8, top_groups = 1, group_score = max", "hold fewer than top_k = 2"),
        ("bias_rate = 0.01", "bias_rate moves the correction bias, and there is none"),
    ],
)
def test_groups_that_cannot_route_are_refused_with_a_hint(routing, message):
    ((code, text, hint),) = errors(routing)
    assert code == "MSL119" and message in text and hint


def test_the_sequence_wise_loss_by_hand():
    """DeepSeek-V3 eq. 17-20 by hand, E = 4 experts, k = 2, sequences of T = 4:
    uniform scores and each expert chosen by half the tokens give f_e = 4 / (2 * 4) * 2
    = 1 and P_e = 1/4, so α * sum_e f_e P_e = α; a sequence whose every token picks
    experts 0 and 1 with normalised scores 1/2 each gives f = (2, 2, 0, 0), P = (1/2,
    1/2, 0, 0): 2α, and the mean over that sequence and a uniform one is 1.5α. The
    batch-wise loss of the two together differs: (by Megatron's definition) 4 / (8^2 *
    2) * (probability sums (3, 3, 1, 1) . counts (6, 6, 2, 2)) = 40 / 32 α = 1.25α."""
    from tests.reference_routing import load_balancing_loss, sequence_loss

    alpha = 1e-3
    uniform = np.full((4, 4), 0.25)
    balanced = np.array([[0, 1], [2, 3], [0, 1], [2, 3]])
    assert sequence_loss(uniform, balanced, 4, 4, alpha) == pytest.approx(alpha)
    peaked = np.array([[0.5, 0.5, 0.0, 0.0]] * 4)
    probs = np.concatenate([peaked, uniform])
    chosen = np.concatenate([np.array([[0, 1]] * 4), balanced])
    assert sequence_loss(peaked, chosen[:4], 4, 4, alpha) == pytest.approx(2 * alpha)
    assert sequence_loss(probs, chosen, 4, 4, alpha) == pytest.approx(1.5 * alpha)
    assert load_balancing_loss(probs, chosen, 4, alpha) == pytest.approx(1.25 * alpha)


def test_the_choice_adds_memory_bound_passes_and_no_flops():
    """tiny_moe (n = 128 tokens a micro-batch) with 8 experts: the bias written and
    read (2 passes over [n, E] fp32) and the groups' scores, mask and masked scores
    (4 passes) add 6 * n * E * 4 bytes of memory-bound work to the plain top-k's, and
    no FLOPs (the choice is no matmul)."""
    from msgen.analysis.facts import context
    from msgen.estimate.flops import op_work

    def work(routing: str):
        result = analyze_text(spec(routing), "spec.msl", SPEC.parent)
        assert result.ok, [d.message for d in result.diagnostics]
        return op_work(result.facts.graphs["decoder"].ops["ffn2"], context(result.spec))

    plain, deepseek = work("router = sigmoid"), work(V3)
    assert deepseek.memory_bytes - plain.memory_bytes == 6 * 128 * E * 4
    assert deepseek.matmul_flops == plain.matmul_flops
    assert deepseek.kernel_flops == plain.kernel_flops
