"""The mla op's generated cell (templates/ops/mla.py.j2) run by MindSpore on the CPU:
against transformers 4.57's DeepseekV3Attention with the same weights, q LoRA on and
off, yarn on and off, and op by op against the numpy references (tests/test_op_mla.py) inside the
compiled tests/specs/tiny_mla.msl network, whose loss is numpy's too; and (slow) its
train.py trained on the CPU, stand-alone and as two data-parallel processes under msrun."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from tests import emit_fixtures
from tests import reference_numpy as ref
from tests.emit_fixtures import compile_spec, plan
from tests.test_api_check import instantiate, stage_devices, strategy_problems, trace, unexercised
from tests.test_generated import batch, check_against_plan, mindspore_loss, randomised
from tests.test_generated import build as build_network
from tests.test_multirank import checkpoint, finish, log_rows, msrun, standalone
from tests.test_op_mla import YARN, hf_forward, hf_module, hf_params
from tests.test_ops import network
from tests.test_ops import test_each_op_computes_its_reference as computes_its_reference
from tests.test_ops import test_each_op_imports_what_its_code_uses as imports_what_it_uses

# name -> (the change to tiny_mla.msl, q LoRA, transformers' rope_scaling)
VARIANTS = {
    "tiny_mla": (None, True, YARN),
    "tiny_mla_no_q_lora": ("q_lora_rank = 24, ", False, YARN),
    "tiny_mla_plain_rope": (r",\s*rope_scaling = yarn\([^)]*\)", True, None),
}


@pytest.fixture(params=sorted(VARIANTS))
def variant(request, tmp_path, monkeypatch):
    name = request.param
    change = VARIANTS[name][0]
    if change:
        text = emit_fixtures.SPECS["tiny_mla"].read_text()
        path = tmp_path / f"{name}.msl"
        changed = re.sub(change, "", text)
        assert changed != text
        path.write_text(changed)
        monkeypatch.setitem(emit_fixtures.SPECS, name, path)
    return name


def test_the_generated_cell_equals_transformers_deepseek_v3_attention(variant):
    """The first layer's MLA cell, its weights transformers' (transposed to [in, out]),
    on a random batch of two rows: its output equals DeepseekV3Attention's before
    o_proj, in fp32 within 1e-4."""
    import mindspore as ms

    _, q_lora, scaling = VARIANTS[variant]
    module, config, modeling = hf_module("v3", q_lora, rope_scaling=scaling)
    cell = network(variant).decoder[0].att
    weights = hf_params(module)
    params = {p.name.rsplit(".", 1)[-1]: p for p in cell.get_parameters()}
    assert sorted(params) == sorted(weights)
    for name, value in weights.items():
        params[name].set_data(ms.Tensor(value.astype(np.float32)))
    x = np.random.default_rng(3).normal(size=(2, 32, 64))
    got = cell(ms.Tensor(x.astype(np.float32))).asnumpy()
    want = hf_forward("v3", module, config, modeling, x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_mla_code_computes_its_reference(variant):
    computes_its_reference(variant)


def test_mla_code_imports_what_it_uses():
    imports_what_it_uses("tiny_mla")


def test_parameters_are_the_plan_params():
    check_against_plan(build_network("tiny_mla"), emit_fixtures.plan_json("tiny_mla"))


def test_strategies_fit_the_inputs_and_the_shape_only_trace_agrees():
    net = instantiate("tiny_mla", lazy=False)
    real = trace(net, "tiny_mla", shape_only=False)
    assert real and strategy_problems(real, stage_devices("tiny_mla")) == []
    assert unexercised(net, real) == set()
    shaped = trace(instantiate("tiny_mla", lazy=True), "tiny_mla", shape_only=True)
    assert [(c.path, c.shapes) for c in shaped] == [(c.path, c.shapes) for c in real]


def test_the_network_loss_is_numpys():
    net, rng = randomised("tiny_mla")
    tokens, labels = batch("tiny_mla", rng, rows=2)
    params = {p.name: p.asnumpy() for p in net.get_parameters()}
    loss = mindspore_loss(net, tokens, labels)
    expected = ref.forward_loss(plan("tiny_mla"), params, tokens, labels)
    assert abs(loss - expected) <= 1e-4 * max(1.0, abs(expected)), (loss, expected)


@pytest.mark.slow
def test_tiny_mla_trains(tmp_path):
    """train.py --synthetic for 20 steps on the CPU: the loss starts near uniform over
    the 256 tokens (ln 256) and falls, gradients flowing through every MLA weight (the
    grad norm is finite and the loss falls below 70% of the start)."""
    folder = emit_fixtures.copy_compiled("tiny_mla", tmp_path / "tiny")
    finish(standalone(folder, "output", "--synthetic", "--steps", "20"), folder)
    rows = log_rows(folder / "output" / "rank_0" / "log.csv")
    losses = [float(r["loss"]) for r in rows]
    assert [int(r["step"]) for r in rows] == list(range(1, 21))
    assert abs(losses[0] - math.log(256)) < 0.1, losses
    assert np.mean(losses[-3:]) < 0.7 * losses[0], losses
    assert all(math.isfinite(float(r["grad_norm"])) for r in rows)


class FlashStandIn:
    """FlashAttentionScore's contract in its 2.10 docstring (BNSD, causal sparse_mode 2),
    for the CPU: q, k and v of one head size D, a multiple of 16 at most 512; returns
    (softmax_max, softmax_sum, softmax_out, attention_out) with the output as q's shape."""

    def __init__(self, scale):
        self.scale = scale
        self.shapes = []

    def __call__(self, q, k, v, real_shift, drop_mask, padding_mask, attn_mask):
        import mindspore as ms

        q, k, v = (t.asnumpy().astype(np.float64) for t in (q, k, v))
        self.shapes.append((q.shape, k.shape, v.shape))
        assert q.shape == k.shape == v.shape and q.shape[-1] % 16 == 0 <= 512 - q.shape[-1]
        s = q.shape[2]
        scores = q @ k.transpose(0, 1, 3, 2) * self.scale
        scores = np.where(attn_mask.asnumpy()[:s, :s] == 1, -np.inf, scores)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        out = probs / probs.sum(-1, keepdims=True) @ v
        return None, None, None, ms.Tensor(out.astype(np.float32))


def test_flash_pads_v_to_the_kernels_head_size_and_cuts_the_output_back(tmp_path, monkeypatch):
    """tiny_mla with flash and a q/k head size of 32 (v 12): on Ascend the cell builds
    FlashAttentionScore for the causal band (sparse_mode 2, next_tokens 0) with the op's
    softmax scale; with the kernel's contract run on the CPU in its place, v reaches it
    padded to 32 and the cell's output equals the numpy reference's."""
    import mindspore as ms

    from msgen.ops.mla import softmax_scale
    from tests.test_op_mla import mla

    text = emit_fixtures.SPECS["tiny_mla"].read_text()
    text = text.replace("qk_nope_head_dim = 16", "qk_nope_head_dim = 24")
    text = text.replace("v_head_dim = 12,", "v_head_dim = 12, flash = true,")
    path = tmp_path / "tiny_mla_flash.msl"
    path.write_text(text)
    monkeypatch.setitem(emit_fixtures.SPECS, "tiny_mla_flash", path)
    get_context = ms.get_context
    monkeypatch.setattr(
        ms, "get_context", lambda key: "Ascend" if key == "device_target" else get_context(key)
    )
    cell = network("tiny_mla_flash").decoder[0].att
    node = next(n for n in plan("tiny_mla_flash").spec.layers["decoder"].ops if n.kind == "mla")
    attrs = cell.attend.attrs
    assert cell.flash and (attrs["sparse_mode"], attrs["next_tokens"]) == (2, 0)
    assert attrs["scale_value"] == pytest.approx(softmax_scale(node), rel=1e-6)
    assert attrs["head_num"] == 4
    cell.attend = FlashStandIn(softmax_scale(node))
    x = np.random.default_rng(4).normal(size=(2, 32, 64))
    got = cell(ms.Tensor(x.astype(np.float32))).asnumpy()
    assert cell.attend.shapes == [((2, 4, 32, 32),) * 3]
    params = {p.name.rsplit(".", 1)[-1]: p.asnumpy().astype(np.float64)
              for p in cell.get_parameters()}  # fmt: skip
    want = mla(x, params, 4, 24, 8, 12, scale=softmax_scale(node), scaling=YARN)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


DP_STEPS = 4


@pytest.mark.slow
def test_two_data_parallel_ranks_train_as_the_standalone_run(tmp_path):
    """tiny_mla on dp = 2 (tp = 1) as two processes under msrun and stand-alone over the
    same global batches: after 4 steps both ranks hold the same weights, the
    stand-alone run's within 1e-4, and log its losses and gradient norms."""
    text = emit_fixtures.SPECS["tiny_mla"].read_text()
    for old, new in (("per_node = 8", "per_node = 2"), ("dp = 4\n    tp = 2", "dp = 2\n    tp = 1"),
                     ("global_batch = 8             # = micro_batch * dp * micro_batches = 1 * 4 * 2",
                      "global_batch = 4")):  # fmt: skip
        assert old in text
        text = text.replace(old, new)
    (tmp_path / "tiny_mla_dp.msl").write_text(text)
    folder = compile_spec(tmp_path / "tiny_mla_dp.msl", tmp_path / "out")
    cwd = folder / "msrun_cwd"
    cwd.mkdir()
    steps = ("--synthetic", "--steps", str(DP_STEPS))
    started = [(standalone(folder, "alone", *steps), folder),
               (msrun(folder, cwd, folder / "msrun", *steps), cwd)]  # fmt: skip
    for proc, where in started:
        finish(proc, where)
    last = f"step_{DP_STEPS:08d}.ckpt"
    ranks = [checkpoint(folder / "msrun" / f"rank_{r}" / last) for r in (0, 1)]
    alone = checkpoint(folder / "alone" / "rank_0" / last)
    assert set(ranks[0]) == set(ranks[1]) == set(alone)
    assert any(name.endswith(".att.kv_b") for name in alone)
    for name in ranks[0]:
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name], err_msg=name)
        np.testing.assert_allclose(ranks[0][name], alone[name], atol=1e-4, err_msg=name)
    alone_log = log_rows(folder / "alone" / "rank_0" / "log.csv")
    for rank in (0, 1):
        log = log_rows(folder / "msrun" / f"rank_{rank}" / "log.csv")
        assert [int(r["step"]) for r in log] == list(range(1, DP_STEPS + 1))
        for mine, theirs in zip(log, alone_log, strict=True):
            for key in ("loss", "grad_norm"):
                assert float(mine[key]) == pytest.approx(float(theirs[key]), abs=1e-4), key
