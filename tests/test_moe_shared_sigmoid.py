"""moe's `shared_sigmoid`: the shared experts' output scaled per token by
sigmoid(x w), w [hidden, 1], as Qwen2-MoE's `shared_expert_gate` does (transformers
4.57 models/qwen2_moe/modeling_qwen2_moe.py `Qwen2MoeSparseMoeBlock.forward`:
`F.sigmoid(self.shared_expert_gate(hidden_states)) * shared_expert_output`). The
generated cell, run by MindSpore on the CPU, against that block with the same
weights; its parameter, FLOPs and saved tensors on tests/specs/tiny_moe.msl; the
numpy reference (tests/test_op_moe.py) runs it op by op in tests/test_moe_code.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from msgen.analysis.facts import context
from msgen.analysis.plan import Plan
from msgen.compiler import analyze_text
from msgen.estimate.flops import op_work, step_flops
from tests.emit_fixtures import compile_spec, load, network_class
from tests.oracles import require
from tests.test_op_moe import moe

SPEC = Path(__file__).resolve().parent / "specs" / "tiny_moe.msl"
H, E, K, F = 64, 4, 2, 32  # tiny_moe's hidden, experts, top_k, ffn = shared_ffn


def gated(args: str = "shared_sigmoid = true, ") -> str:
    return SPEC.read_text().replace("aux_loss = 0.01", args + "aux_loss = 0.01")


def analysed(text: str):
    result = analyze_text(text, "spec.msl", SPEC.parent)
    assert result.ok, [d.message for d in result.diagnostics]
    return result


def qwen2_moe_block(norm_topk: bool):
    """transformers' Qwen2-MoE block of tiny_moe's dims, every weight drawn at random."""
    torch = require("torch")
    transformers = require("transformers")
    from transformers.models.qwen2_moe import modeling_qwen2_moe

    config = transformers.Qwen2MoeConfig(
        hidden_size=H, moe_intermediate_size=F, shared_expert_intermediate_size=F,
        num_experts=E, num_experts_per_tok=K, norm_topk_prob=norm_topk, hidden_act="silu",
    )  # fmt: skip
    torch.manual_seed(0)
    block = modeling_qwen2_moe.Qwen2MoeSparseMoeBlock(config).eval()
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.3)
    return block


def msgen_weights(block) -> dict[str, np.ndarray]:
    """The block's weights as the moe op holds them: [in, out], the experts stacked."""

    def t(linear):
        return linear.weight.detach().numpy().T

    def stacked(name):
        return np.stack([t(getattr(m, name)) for m in block.experts])

    shared = block.shared_expert
    return {
        "router": t(block.gate),
        "gate": stacked("gate_proj"),
        "up": stacked("up_proj"),
        "down": stacked("down_proj"),
        "shared_gate": t(shared.gate_proj),
        "shared_up": t(shared.up_proj),
        "shared_down": t(shared.down_proj),
        "shared_sigmoid": t(block.shared_expert_gate),
    }


def first_moe_cell(text: str, folder: Path, weights: dict[str, np.ndarray]):
    """The moe cell `ffn2` of the first decoder layer of the network `text` compiles
    to, in evaluation mode, holding `weights` (by parameter name; all of its own)."""
    import json

    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE)
    folder.mkdir(parents=True, exist_ok=True)
    spec = folder / "spec.msl"
    spec.write_text(text)
    compiled = compile_spec(spec, folder / "out")
    model = load(compiled, "model")
    network = network_class(model, json.loads((compiled / "plan.json").read_text()))()
    cell = network.decoder[0].ffn2
    cell.set_train(False)
    held = {p.name.rsplit(".", 1)[-1]: p for p in cell.get_parameters()}
    assert sorted(held) == sorted(weights)
    for name, value in weights.items():
        held[name].set_data(ms.Tensor(value.astype(np.float32)))
    return cell


def test_the_generated_cell_equals_transformers_qwen2_moe_block(tmp_path):
    """The first layer's moe cell of the generated network, given the block's weights
    (Qwen2-MoE's default norm_topk_prob = false), computes the block's output in fp32."""
    import mindspore as ms

    torch = require("torch")
    block = qwen2_moe_block(norm_topk=False)
    text = gated("shared_sigmoid = true, norm_topk = false, ")
    cell = first_moe_cell(text, tmp_path, msgen_weights(block))
    x = torch.randn(2, 5, H)
    with torch.no_grad():
        want, _ = block(x)
    got, _ = cell(ms.Tensor(x.numpy()))  # (output, auxiliary loss): tiny_moe's aux_loss
    np.testing.assert_allclose(got.asnumpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    assert np.abs(want.numpy()).max() > 0.1  # a comparison of values, not of zeros


@pytest.mark.parametrize("norm_topk", [False, True])
def test_the_reference_equals_transformers_qwen2_moe_block(norm_topk):
    torch = require("torch")
    block = qwen2_moe_block(norm_topk)
    x = torch.randn(3, 4, H)
    with torch.no_grad():
        want, _ = block(x)
    params = {k: v.astype(np.float64) for k, v in msgen_weights(block).items()}
    got = moe(x.numpy().astype(np.float64), params, E, K, norm_topk=norm_topk)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)


def test_the_gate_is_one_whole_hidden_by_one_matrix_counted_in_params_and_flops():
    """shared_sigmoid adds [hidden, 1] per moe (2 layers: 2 x 64 parameters), whole on
    every rank; its matmul 2 n h model FLOPs per layer forward (n = 128 tokens), times
    3 (forward and backward) x 2 layers x 2 micro-batches; it saves the gate's sigmoid
    [n, 1] and the shared output [n, h] the product's backward reads."""
    plain, with_gate = analysed(gated("")), analysed(gated())
    of = with_gate.facts.graphs["decoder"].ops["ffn2"]
    params = {p.name: p for p in of.params}
    assert params["shared_sigmoid"].shape == (H, 1)
    assert params["shared_sigmoid"].split == ((), ())

    def total(result):
        return Plan(result.spec, result.facts).params_total

    assert total(with_gate) - total(plain) == 2 * H
    n = 128
    flops = step_flops(Plan(with_gate.spec, with_gate.facts)).model
    assert flops - step_flops(Plan(plain.spec, plain.facts)).model == 3 * 2 * 2 * (2 * n * H)
    saves = {s.key: s.shape for s in of.saves}
    assert saves["ffn2.shared_score"] == (n, 1) and saves["ffn2.shared_out"] == (n, H)
    work = op_work(of, context(with_gate.spec))
    plain_of = plain.facts.graphs["decoder"].ops["ffn2"]
    assert work.matmul_flops - op_work(plain_of, context(plain.spec)).matmul_flops == 2 * n * H


def test_a_gate_without_shared_experts_or_split_is_refused():
    """shared_sigmoid with shared_ffn = 0 is MSL119; a split of its matrix MSL210."""
    text = gated().replace("shared_ffn = ffn, ", "")
    result = analyze_text(text, "spec.msl", SPEC.parent)
    assert [d.code for d in result.diagnostics if d.is_error] == ["MSL119"]
    assert "shared_sigmoid" in result.diagnostics[0].message
    text = gated().replace("aux_loss = 0.01)", "aux_loss = 0.01) shared_sigmoid @ [tp, 1]")
    errors = [d for d in analyze_text(text, "spec.msl", SPEC.parent).diagnostics if d.is_error]
    assert [d.code for d in errors] == ["MSL210"] and "cannot be split" in errors[0].message
