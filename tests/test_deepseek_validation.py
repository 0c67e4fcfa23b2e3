"""DeepSeek-V2-Lite and DeepSeek-V3 as MSL (specs/validation/deepseek_v2_lite.msl,
deepseek_v3.msl: `mla` attention, the first layers dense, the rest `moe` with shared
experts; V3's sigmoid routing with the correction bias, group-limited): `estimate`
counts the parameters transformers 4.57's models hold and those a token reads, and
DeepSeek-V3 trains on 2,048 Ascend 910B within each device's memory.

By hand (transformers' DeepseekV2/V3 modules, [out, in] each):

- V2-Lite: embedding and untied output 2 · 102400 · 2048 = 419,430,400, final norm 2048;
  per layer the attention 13,763,072 (q 2048 · 3072, kv_a 2048 · 576, kv_norm 512,
  kv_b 512 · 4096, o 2048 · 2048) and two norms 4096; the dense layer's SwiGLU
  3 · 2048 · 10944 = 67,239,936; each of the 26 sparse layers' router 2048 · 64, 64
  experts 3 · 2048 · 1408 each and the 2 shared experts 3 · 2048 · 2816: 571,080,704.
  15,706,484,224 in all (published: 15.7 B), as transformers' model on the meta device
  counts it (the slow test). A token reads 6 of the 64 experts: 2,661,150,208, of
  which the input embedding is 209,715,200 (DeepSeek's 2.4 B activated leaves it out:
  2,451,435,008).
- V3: 671,026,404,352 (transformers 4.57's DeepseekV3ForCausalLM without the MTP
  layer); a token leaves 248 of each sparse layer's 256 experts unread, 58 · 248 ·
  3 · 7168 · 2048 = 633,474,121,728, so it reads 37,552,282,624, 36,625,603,584 without
  the input embedding (published: 37 B).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from msgen.cli import main

ROOT = Path(__file__).resolve().parents[1]
VALIDATION = ROOT / "specs" / "validation"
CONFIGS = ROOT / "tests" / "hf_configs"

# name -> (transformers' parameters, parameters a token leaves unread, input embedding,
# published total, published activated)
MODELS = {
    "deepseek_v2_lite": (15_706_484_224, 26 * 58 * 3 * 2048 * 1408, 102400 * 2048, 15.7e9, 2.4e9),
    "deepseek_v3": (671_026_404_352, 58 * 248 * 3 * 7168 * 2048, 129280 * 7168, 671e9, 37e9),
}


def estimate_json(capsys, spec: Path, *argv: str) -> dict:
    assert main(["estimate", str(spec), "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_estimate_counts_transformers_model_and_the_published_figures(capsys, name):
    total, unread, embedding, published, activated = MODELS[name]
    doc = estimate_json(capsys, VALIDATION / f"{name}.msl")
    assert doc["params_total"] == total
    assert doc["params_active"] == total - unread
    # the published figures, in their rounding
    assert round(doc["params_total"] / published, 3) == 1.0
    # DeepSeek's activated count leaves the input embedding out: within 2.5% then
    assert abs((doc["params_active"] - embedding) / activated - 1) < 0.025


def transformers_count(config: dict, layers: int) -> int:
    """The parameters of transformers' model of `config` with `layers` layers (meta
    device: shapes, no memory)."""
    import torch
    import transformers

    fields = {k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")}
    made = transformers.AutoConfig.for_model(**fields | {"num_hidden_layers": layers})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(made)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_transformers_counts_the_validation_specs_parameters(capsys, name):
    """The sparse layers after the first k dense ones are alike, so transformers' count
    is a + b (L - k - 1) from its models of k + 1 and k + 2 layers (the whole V3 takes it
    minutes to build)."""
    config = json.loads((CONFIGS / f"{name}.json").read_text())
    k = config["first_k_dense_replace"]
    one, two = transformers_count(config, k + 1), transformers_count(config, k + 2)
    expected = one + (two - one) * (config["num_hidden_layers"] - k - 1)
    assert estimate_json(capsys, VALIDATION / f"{name}.msl")["params_total"] == expected
    assert expected == MODELS[name][0]


def test_deepseek_v3_fits_2048_ascend_910b(capsys):
    """The spec's layout, DeepSeek's own shape of it (pp 16, ep 64 inside dp 128, zero 1,
    no tp; arXiv 2412.19437 §3.2), on 256 servers of 8 x 910B (64 GiB, 58 GiB the
    budget): every stage fits. The experts are what fills a device: 256 / 64 = 4 of
    each sparse layer's experts per rank, their fp32 weights, gradients and Adam states
    shared only over dp / ep = 2 ranks by zero 1."""
    doc = estimate_json(capsys, VALIDATION / "deepseek_v3.msl")
    assert doc["devices"] == 2048 and doc["device"] == "ascend910b"
    assert doc["mesh"] == {"dp": 128, "tp": 1, "pp": 16, "ep": 64}
    assert doc["fits"] and all(stage["fits"] for stage in doc["stages"])
    assert max(stage["total_bytes"] for stage in doc["stages"]) <= doc["budget_bytes"]
    assert sum(stage["layers"] for stage in doc["stages"]) == 61


# `msgen plan specs/validation/deepseek_v3.msl --top 1` (minutes over 2,048 devices:
# 30,924 layouts pass every check but the budget, 1,053 fit): its best plan
PLANNED = (
    *("mesh.dp=64", "mesh.tp=1", "mesh.pp=32", "mesh.ep=8", "train.micro_batch=1"),
    *("pipeline.micro_batches=256", "train.zero=2", "recompute.decoder_moe=select(att, moe)"),
    *("recompute.dense=full", "pipeline.schedule=1f1b"),
)


def test_the_planners_deepseek_v3_plan_fits_and_beats_the_written_layout(capsys):
    """The planner's best layout for DeepSeek-V3 on the 2,048 devices (pp 32, ep 8 inside
    dp 64, zero 2, the attention and experts recomputed) fits and is predicted faster
    than the spec's DeepSeek-shaped one (pp 16, ep 64): ep 8 keeps each layer's
    all-to-alls inside a server."""
    written = estimate_json(capsys, VALIDATION / "deepseek_v3.msl")
    sets = [a for s in PLANNED for a in ("--set", s)]
    planned = estimate_json(capsys, VALIDATION / "deepseek_v3.msl", *sets)
    assert planned["devices"] == 2048 and planned["fits"]
    assert all(stage["fits"] for stage in planned["stages"])
    assert planned["time"]["step_s"] < written["time"]["step_s"]
    across = "ep all-to-alls across servers"
    assert across in written["time"]["moe_validation"]["reason"]
    assert across not in planned["time"]["moe_validation"]["reason"]
