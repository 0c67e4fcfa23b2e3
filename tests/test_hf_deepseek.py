"""DeepSeek-V2 and DeepSeek-V3 from Hugging Face, held against transformers 4.57: tiny
DeepseekV3ForCausalLM (q LoRA, sigmoid routing with a random correction bias, 4 groups
of which 2 are kept) and DeepseekV2ForCausalLM (no q LoRA, group_limited_greedy
softmax routing), random weights (norms not ones), yarn on: `import hf` -> `ckpt
from-hf` -> the generated model's logits equal transformers' (fp32, 1e-4), and `ckpt
to-hf` gives back every tensor bit for bit (the correction bias included); the
published DeepSeek-V3 config imports with transformers' parameter count
(671,026,404,352, tests/test_deepseek_validation.py builds it)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from msgen.hf.tensors import read_header, read_tensor
from tests.oracles import require
from tests.test_ckpt_hf import SEQ, compiled_network, msgen, msgen_logits
from tests.test_import_hf import CONFIGS, estimate, imported

torch = require("torch")
transformers = require("transformers")
ms = require("mindspore")

YARN = {
    "type": "yarn",
    "factor": 4.0,
    "original_max_position_embeddings": 8,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}
COMMON = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 16,
    "v_head_dim": 16,
    "max_position_embeddings": SEQ,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": YARN,
}
MODELS = {
    # q LoRA, 4 groups of 2 experts, the best 2 groups kept, weights renormalised x 2.5
    "deepseek_v3": (
        "DeepseekV3Config",
        {
            "q_lora_rank": 24,
            "n_shared_experts": 1,
            "n_group": 4,
            "topk_group": 2,
            "routed_scaling_factor": 2.5,
            "norm_topk_prob": True,
        },
    ),
    # no q LoRA, softmax, group_limited_greedy (best single score per group), 2 shared
    "deepseek_v2": (
        "DeepseekV2Config",
        {
            "q_lora_rank": None,
            "n_shared_experts": 2,
            "n_group": 4,
            "topk_group": 2,
            "topk_method": "group_limited_greedy",
            "routed_scaling_factor": 1.5,
        },
    ),
}


@pytest.fixture(scope="module", autouse=True)
def pynative():
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")


def hf_model(family: str, folder: Path, dtype=None) -> object:
    name, extra = MODELS[family]
    config = getattr(transformers, name)(**COMMON, **extra)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # far from uniform logits, so a misplaced weight shows
        for p in model.parameters():
            p.normal_(0.0, 0.2)
        for n, b in model.named_buffers():
            if n.endswith("e_score_correction_bias"):  # small: it moves close scores
                b.uniform_(-0.05, 0.05)
    model = model.to(dtype or torch.float32)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def converted(family: str, tmp_path: Path, spec_edit=None):
    model = hf_model(family, tmp_path / "hf")
    spec = tmp_path / "m.msl"
    code, err = msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ)
    assert code == 0, err
    if spec_edit is not None:
        spec.write_text(spec_edit(spec.read_text()))
    code, err = msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "init")
    assert code == 0, err
    net = compiled_network(spec, tmp_path / "gen")
    missing, _ = ms.load_param_into_net(
        net, ms.load_checkpoint(str(tmp_path / "init" / "model.ckpt"))
    )
    return model, net, spec, missing


def logits_error(model, net) -> float:
    tokens = np.random.default_rng(1).integers(0, 128, size=(2, SEQ))
    with torch.no_grad():
        expected = model(torch.tensor(tokens)).logits.numpy()
    got = msgen_logits(net, tokens)
    return float(np.abs(got - expected).max() / max(1.0, np.abs(expected).max()))


@pytest.mark.parametrize("family", sorted(MODELS))
def test_imported_weights_give_transformers_logits(tmp_path, family):
    model, net, spec, missing = converted(family, tmp_path)
    # every weight and the correction bias; the load count is zeroed before each step
    assert [n for n in missing if n != "add_aux.total" and not n.endswith(".expert_load")] == []
    text = spec.read_text()
    assert ("q_lora_rank = 24" in text) == (family == "deepseek_v3")
    assert "expert_groups = 4, top_groups = 2" in text
    assert logits_error(model, net) < 1e-4


def test_ignoring_the_groups_picks_other_experts(tmp_path):
    """The groups decide here: the same weights without the group limit give other
    logits (so the test above holds the groups, not just the top-k)."""
    model, net, _, _ = converted(
        "deepseek_v3", tmp_path, lambda t: t.replace(", expert_groups = 4, top_groups = 2", "")
    )
    assert logits_error(model, net) > 1e-2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("family", sorted(MODELS))
def test_to_hf_gives_back_the_source_bit_for_bit(tmp_path, family, dtype):
    hf_model(family, tmp_path / "hf", getattr(torch, dtype))
    spec = tmp_path / "m.msl"
    assert msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ)[0] == 0
    assert msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "init")[0] == 0
    code, err = msgen("ckpt", "to-hf", spec, tmp_path / "init", "-o", tmp_path / "back")
    assert code == 0, err
    source = tmp_path / "hf" / "model.safetensors"
    back = tmp_path / "back" / "model.safetensors"
    entries, _, _ = read_header(source)
    assert set(read_header(back)[0]) == set(entries)
    assert any(n.endswith("e_score_correction_bias") for n in entries) == (family == "deepseek_v3")
    for name in entries:
        a, a_type = read_tensor(source, name)
        b, b_type = read_tensor(back, name)
        assert a_type == b_type and a.shape == b.shape and np.array_equal(a, b), name
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back")
    assert again.config.model_type == family


@pytest.mark.parametrize("family", sorted(MODELS))
def test_the_tensors_a_config_gives_are_those_transformers_saves(tmp_path, family):
    from msgen.hf.config import model_of, read_config
    from msgen.hf.layout import hf_shapes

    hf_model(family, tmp_path)
    saved = {n: e.shape for n, e in read_header(tmp_path / "model.safetensors")[0].items()}
    assert hf_shapes(model_of(read_config(tmp_path / "config.json"))) == saved


def test_the_published_deepseek_v3_config_imports_with_transformers_count(tmp_path):
    proc, spec = imported(tmp_path, CONFIGS / "deepseek_v3.json")
    assert proc.returncode == 0, proc.stderr
    doc = estimate(spec)
    # the main model's; its multi-token prediction layer is tests/test_hf_mtp.py's
    mtp, mtp_active = 11_610_067_968, 11_610_067_968 - 248 * 3 * 7168 * 2048
    assert doc["params_total"] - mtp == 671_026_404_352
    # 58 sparse layers, 248 of 256 experts unread per token
    assert doc["params_active"] - mtp_active == 671_026_404_352 - 58 * 248 * 3 * 7168 * 2048
    text = spec.read_text()
    assert re.search(r"part1 += repeat decoder\(emb\) 3", text)
    assert "router = sigmoid, expert_bias = true" in text


def test_the_published_deepseek_v2_lite_config_imports_with_transformers_count(tmp_path):
    """15,706,484,224: what transformers' DeepseekV2ForCausalLM of this config holds
    (tests/test_deepseek_validation.py builds it), the published 15.7 B."""
    proc, spec = imported(tmp_path, CONFIGS / "deepseek_v2_lite.json")
    assert proc.returncode == 0, proc.stderr
    assert estimate(spec)["params_total"] == 15_706_484_224
    text = spec.read_text()
    assert "yarn_mscale = false" in text and "q_lora_rank" not in text
    assert "norm_topk = false" in text and "expert_groups" not in text


def meta_count(config: dict) -> int:
    made = transformers.AutoConfig.for_model(**config)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(made)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("family", sorted(MODELS))
def test_keys_a_config_leaves_out_are_transformers_defaults(tmp_path, family):
    """A config of sizes only: q_lora_rank (1536 for both), n_shared_experts, n_group
    and topk_group (V3: 8 and 4), routed_scaling_factor (V3: 2.5), first_k_dense_replace
    (V2: 0, V3: 3), norm_topk_prob, topk_method left to transformers' defaults; the
    spec counts what transformers' model holds and routes as its config says."""
    config = {
        "model_type": family,
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 96,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "n_routed_experts": 16,
        "num_experts_per_tok": 2,
        "rms_norm_eps": 1e-6,
    }
    proc, spec = imported(tmp_path, config)
    assert proc.returncode == 0, proc.stderr
    assert estimate(spec)["params_total"] == meta_count(config)
    text = spec.read_text()
    assert "q_lora_rank = 1536" in text
    if family == "deepseek_v3":
        assert "part1  = repeat decoder(emb) 3" in text
        assert "expert_groups = 8, top_groups = 4, routed_scaling = 2.5" in text
    else:
        # every layer sparse: one layer kind
        assert "repeat decoder(emb) layers" in text and "moe(" in text
        assert "norm_topk = false" in text and "expert_groups" not in text


@pytest.mark.parametrize(
    "change, message",
    [
        ({"topk_method": "noaux_tc"}, "topk_method 'noaux_tc'"),
        ({"n_group": 3}, "n_group = 3 does not divide n_routed_experts = 64"),
        ({"attention_bias": True}, "attention_bias is true"),
        ({"n_shared_experts": None}, "n_shared_experts is null"),
    ],
)
def test_what_msgen_cannot_mean_is_one_line(tmp_path, change, message):
    config = json.loads((CONFIGS / "deepseek_v2_lite.json").read_text())
    config |= {"topk_method": "group_limited_greedy", "n_group": 8, "topk_group": 3}
    proc, spec = imported(tmp_path, config | change)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert message in proc.stderr and not spec.exists()


SLICED = ("mesh.dp=2", "mesh.tp=2", "mesh.pp=1", "mesh.ep=2", "train.zero=0")


def test_per_rank_slices_merge_back_with_the_correction_bias(tmp_path):
    """DeepSeek-V3 on dp 2 x tp 2 with ep 2: each rank holds 4 of the 8 experts, half
    of the heads' up-projections, and the whole correction bias (a buffer, never
    split); the ranks' slices merge into the whole checkpoint, and to-hf of them gives
    every source tensor back bit for bit."""
    hf_model("deepseek_v3", tmp_path / "hf")
    spec = tmp_path / "m.msl"
    assert msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ,
                 "--devices", 4, "--per-node", 4)[0] == 0  # fmt: skip
    sets = [a for s in SLICED for a in ("--set", s)]
    assert msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "whole")[0] == 0
    code, err = msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "ranks", *sets)
    assert code == 0, err
    whole = ms.load_checkpoint(str(tmp_path / "whole" / "model.ckpt"))
    rank3 = ms.load_checkpoint(str(tmp_path / "ranks" / "rank_3" / "model.ckpt"))
    assert rank3["decoder_moe.0.moe.gate"].shape == (4, 64, 32)
    assert rank3["decoder_moe.0.att.kv_b"].shape == (16, 64)  # 2 of the 4 heads
    bias = whole["decoder_moe.0.moe.expert_bias"].asnumpy()
    assert np.array_equal(rank3["decoder_moe.0.moe.expert_bias"].asnumpy(), bias)
    code, err = msgen("ckpt", "to-hf", spec, tmp_path / "ranks", "-o", tmp_path / "back", *sets)
    assert code == 0, err
    source, back = tmp_path / "hf" / "model.safetensors", tmp_path / "back" / "model.safetensors"
    assert set(read_header(back)[0]) == set(read_header(source)[0])
    for name in read_header(source)[0]:
        assert np.array_equal(read_tensor(source, name)[0], read_tensor(back, name)[0]), name
