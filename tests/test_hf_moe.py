"""Mixtures of experts (Mixtral, Qwen2-MoE, Qwen3-MoE) and Qwen3 from Hugging Face, held against
transformers 4.57: the published configs import with the parameter count transformers'
own model has; the load-balancing coefficient gives transformers' loss
(`load_balancing_loss_func`) as docs/checkpoints.md states it; per-rank slices on a
mesh with ep and tp merge back to the whole weights; bad input is one line, exit 2,
nothing written (a mesh the experts do not fit: the spec's error, exit 1). (The logits and the round trips: tests/test_ckpt_hf.py, whose
families these are too.)

Published counts: Mixtral-8x7B 46,702,792,704 parameters, 12,879,925,248 active
(tests/test_moe_counts.py); Qwen3-30B-A3B 30,532,122,624, 3,353,032,704 active
(specs/validation/qwen3_30b_a3b.msl); the model cards' 46.7B, 12.9B, 30.5B, 3.3B.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from msgen.hf.tensors import encode, read_header, read_tensor
from tests.oracles import require
from tests.test_ckpt_hf import SEQ, compiled_network, hf_model, msgen, msgen_forward
from tests.test_import_hf import CONFIGS, estimate, imported

torch = require("torch")
transformers = require("transformers")
ms = require("mindspore")

PUBLISHED = {  # name -> (parameters, active parameters) where published
    "mixtral_8x7b": (46_702_792_704, 12_879_925_248),
    "qwen3_30b_a3b": (30_532_122_624, 3_353_032_704),
    "qwen3_8b": (None, None),
    "qwen1_5_moe_a2_7b": (None, None),
}


@pytest.fixture(scope="module", autouse=True)
def pynative():
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")


def transformers_count(config: dict, layers: int | None = None) -> int:
    """The parameters of the model transformers builds from `config`, with `layers`
    layers if given (on the meta device: shapes, no memory)."""
    fields = {k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")}
    if layers is not None:
        fields["num_hidden_layers"] = layers
    made = transformers.AutoConfig.for_model(**fields)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(made)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_configs_import_with_transformers_parameter_count(tmp_path, name):
    """Every layer of these is alike, so transformers' count is a + b L: taken from its
    models of 1 and 2 layers (48 layers of 128 experts take it minutes to build; the
    whole models: the slow test below)."""
    config = json.loads((CONFIGS / f"{name}.json").read_text())
    proc, spec = imported(tmp_path, CONFIGS / f"{name}.json")
    assert proc.returncode == 0, proc.stderr
    doc = estimate(spec)
    one, two = transformers_count(config, 1), transformers_count(config, 2)
    assert doc["params_total"] == one + (two - one) * (config["num_hidden_layers"] - 1)
    total, active = PUBLISHED[name]
    if total is not None:
        assert (doc["params_total"], doc["params_active"]) == (total, active)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mixtral_8x7b", "qwen3_30b_a3b"])
def test_published_moe_configs_count_as_transformers_whole_model(tmp_path, name):
    config = json.loads((CONFIGS / f"{name}.json").read_text())
    proc, spec = imported(tmp_path, CONFIGS / f"{name}.json")
    assert estimate(spec)["params_total"] == transformers_count(config) == PUBLISHED[name][0]


def routed(family: str, tmp_path: Path):
    """A tiny model of `family` imported and converted: transformers' model, the
    generated network with its weights, and the spec."""
    model = hf_model(family, tmp_path / "hf", torch.float32)
    spec = tmp_path / "m.msl"
    code, err = msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ)
    assert code == 0, err
    code, err = msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "init")
    assert code == 0, err
    net = compiled_network(spec, tmp_path / "gen")
    ms.load_param_into_net(net, ms.load_checkpoint(str(tmp_path / "init" / "model.ckpt")))
    return model, net, spec


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "qwen2_moe"])
def test_the_auxiliary_loss_is_transformers_load_balancing_loss(tmp_path, family):
    """msgen's auxiliary loss for the imported coefficient is router_aux_loss_coef times
    the mean over the sparse layers of load_balancing_loss_func on each layer's router
    logits (msgen.hf.experts): with one sparse layer (qwen3_moe here: layer 0 is in
    mlp_only_layers) exactly the loss transformers adds, with two (mixtral) the
    per-layer mean of it."""
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    model, net, _ = routed(family, tmp_path)
    tokens = np.random.default_rng(1).integers(0, 128, size=(2, SEQ))
    with torch.no_grad():
        out = model(torch.tensor(tokens), output_router_logits=True)
    logits = out.router_logits
    config = model.config
    e, k = config.num_local_experts if family == "mixtral" else config.num_experts, 2
    per_layer = [float(load_balancing_loss_func((g,), e, k)) for g in logits]
    _, aux = msgen_forward(net, tokens)
    coef = config.router_aux_loss_coef
    assert aux == pytest.approx(coef * np.mean(per_layer), rel=1e-5)
    if len(logits) == 1:
        assert aux == pytest.approx(coef * float(out.aux_loss), rel=1e-5)


SLICED = ("mesh.dp=2", "mesh.tp=2", "mesh.pp=1", "mesh.ep=2", "train.zero=0")


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe"])
def test_per_rank_slices_on_ep_and_tp_merge_back_to_the_source(tmp_path, family):
    """Mixtral and Qwen2-MoE (its shared expert split over tp, its sigmoid gate whole)
    on dp 2 x tp 2 with ep 2: each rank holds 2 of the 4 experts; the ranks' slices
    merge (MindSpore's transform_checkpoints) into exactly the whole weights, and to-hf
    of them gives every source tensor back bit for bit."""
    hf_model(family, tmp_path / "hf", torch.float32)
    spec = tmp_path / "m.msl"
    assert msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ,
                 "--devices", 4, "--per-node", 4)[0] == 0  # fmt: skip
    sets = [a for s in SLICED for a in ("--set", s)]
    assert msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "whole")[0] == 0
    code, err = msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "ranks", *sets)
    assert code == 0, err
    whole = ms.load_checkpoint(str(tmp_path / "whole" / "model.ckpt"))
    rank0 = ms.load_checkpoint(str(tmp_path / "ranks" / "rank_0" / "model.ckpt"))
    width = 96 if family == "mixtral" else 32
    assert rank0["decoder.0.moe.gate"].shape == (2, 64, width)  # 2 of the 4 experts
    assert rank0["decoder.0.qkv.weight"].shape == (64, 64)  # half of q, k, v's heads
    if family == "qwen2_moe":  # the shared expert column parallel, its gate whole
        assert rank0["decoder.0.moe.shared_gate"].shape == (64, 24)
        assert rank0["decoder.0.moe.shared_sigmoid"].shape == (64, 1)
    code, err = msgen("ckpt", "merge", spec, tmp_path / "ranks", "-o", tmp_path / "m.ckpt", *sets)
    assert code == 0, err
    merged = ms.load_checkpoint(str(tmp_path / "m.ckpt"))
    assert set(merged) == set(whole)
    for name, value in whole.items():
        assert np.array_equal(merged[name].asnumpy(), value.asnumpy()), name
    code, err = msgen("ckpt", "to-hf", spec, tmp_path / "ranks", "-o", tmp_path / "back", *sets)
    assert code == 0, err
    source, back = tmp_path / "hf" / "model.safetensors", tmp_path / "back" / "model.safetensors"
    assert set(read_header(back)[0]) == set(read_header(source)[0])
    for name in read_header(source)[0]:
        assert np.array_equal(read_tensor(source, name)[0], read_tensor(back, name)[0]), name


def test_a_router_of_another_shape_is_one_line_and_nothing_is_written(tmp_path):
    """The router (gate) of 5 experts where config.json says 4."""
    hf_model("mixtral", tmp_path / "hf", torch.float32)
    spec = tmp_path / "m.msl"
    assert msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ)[0] == 0
    path = tmp_path / "hf" / "model.safetensors"
    header = read_header(path)
    tensors = {}
    for name in header[0]:
        array, dtype = read_tensor(path, name, header)
        tensors[name] = (array, dtype)
    gate = "model.layers.1.block_sparse_moe.gate.weight"
    tensors[gate] = (np.zeros((5, 64), np.float32), "F32")
    path.write_bytes(b"".join(encode(tensors, {"format": "pt"})))
    code, err = msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "init")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{gate} is [5, 64], config.json makes it [4, 64]" in err
    assert not (tmp_path / "init").exists()


def test_experts_that_ep_does_not_divide_are_refused_before_writing(tmp_path):
    hf_model("mixtral", tmp_path / "hf", torch.float32)
    spec = tmp_path / "m.msl"
    assert msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ,
                 "--devices", 8, "--per-node", 8)[0] == 0  # fmt: skip
    sets = ("--set", "mesh.dp=8", "--set", "mesh.tp=1", "--set", "mesh.pp=1", "--set", "mesh.ep=8")
    code, err = msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "init", *sets)
    # a mesh the experts do not fit is a spec error (MSL212, status 1), as in compile
    assert code == 1 and "error[MSL212]: ep = 8 does not divide experts = 4" in err, err
    assert "Traceback" not in err and not (tmp_path / "init").exists()


@pytest.mark.parametrize("key", ["num_local_experts", "num_experts"])
def test_a_dense_model_type_with_experts_keys_is_refused(tmp_path, key):
    """LlamaForCausalLM never reads the experts' keys: importing it dense would drop
    them silently, so it is refused, naming the key."""
    config = json.loads((CONFIGS / "llama3_8b.json").read_text()) | {key: 8}
    proc, spec = imported(tmp_path, config)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert f"model_type 'llama' with {key}" in proc.stderr
    assert not spec.exists()


@pytest.mark.slow
def test_step_one_of_init_from_is_transformers_cross_entropy_plus_the_aux_loss(tmp_path):
    """import hf -> from-hf -> train.py --init-from of Qwen3-MoE (a dense layer, a
    sparse one): step 1's logged loss minus its logged aux_loss is transformers'
    cross-entropy on the step's tokens, and aux_loss is the load-balancing loss
    transformers adds (router_aux_loss_coef times load_balancing_loss_func), within
    log.csv's 6 significant digits. The network's running auxiliary-loss total is no
    weight: the run starts from from-hf's weights without it."""
    import csv
    import subprocess
    import sys

    from tests import emit_fixtures

    model = hf_model("qwen3_moe", tmp_path / "hf", torch.float32)
    spec = tmp_path / "m.msl"
    assert msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ)[0] == 0
    # one micro-batch of 2 sequences: the step's losses are one forward's, as transformers'
    text = spec.read_text().replace("global_batch = 64", "global_batch = 2")
    text = text.replace("micro_batch  = 1", "micro_batch  = 2")
    spec.write_text(text.replace("micro_batches = 64", "micro_batches = 1"))
    assert msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "init")[0] == 0
    compiled_network(spec, tmp_path / "gen")
    tree = next(p for p in (tmp_path / "gen").iterdir() if p.is_dir())
    run = subprocess.run(
        [sys.executable, "train.py", "--standalone", "--synthetic", "--steps", "1"]
        + ["--init-from", str(tmp_path / "init"), "--output", str(tmp_path / "out")],
        cwd=tree, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    with (tmp_path / "out" / "rank_0" / "log.csv").open() as f:
        (row,) = list(csv.DictReader(f))
    tokens, labels = next(emit_fixtures.load(tree, "train").synthetic_batches(1, 0, 0))
    with torch.no_grad():
        out = model(torch.tensor(tokens.astype(np.int64)), output_router_logits=True)
        logits = out.logits.reshape(-1, out.logits.shape[-1])
        ce = torch.nn.functional.cross_entropy(
            logits, torch.tensor(labels.reshape(-1).astype(np.int64))
        )
    aux = model.config.router_aux_loss_coef * float(out.aux_loss)
    loss, logged_aux = float(row["loss"]), float(row["aux_loss"])
    assert logged_aux == pytest.approx(aux, rel=1e-5)
    assert loss - logged_aux == pytest.approx(float(ce), rel=2e-5)


def test_a_qwen2_moe_sliding_window_is_refused(tmp_path):
    """Qwen2-MoE's flash path windows the layers from max_window_layers on, its mask
    every layer: msgen cannot mean both."""
    config = json.loads((CONFIGS / "qwen1_5_moe_a2_7b.json").read_text())
    proc, spec = imported(tmp_path, config | {"use_sliding_window": True})
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "use_sliding_window is true" in proc.stderr and not spec.exists()


@pytest.mark.slow
def test_the_planner_lays_an_imported_moe_out_with_ep(tmp_path):
    """Qwen3-30B-A3B over two servers of 8: the planner's layout splits the experts over
    ep (inside dp), fits, and the estimate counts the published active parameters."""
    proc, spec = imported(tmp_path, CONFIGS / "qwen3_30b_a3b.json", "--devices", 16)
    assert proc.returncode == 0, proc.stderr
    assert "mesh chosen by the planner for 16 devices" in proc.stderr
    text = spec.read_text()
    ep = int(text.split("    ep = ")[1].split()[0])
    dp = int(text.split("    dp = ")[1].split()[0])
    assert ep > 1 and dp % ep == 0
    doc = estimate(spec)
    assert all(stage["fits"] for stage in doc["stages"])
    assert doc["params_active"] == PUBLISHED["qwen3_30b_a3b"][1]


def test_per_rank_slices_on_pp_ep_and_zero_merge_back_to_the_source(tmp_path):
    """Mixtral on dp 2 x pp 2 with ep 2 and the parallel optimizer: each stage's ranks
    hold their layer's experts split over ep, and the larger weights are split further
    over dp by the parallel optimizer; the slices merge into exactly the whole weights."""
    hf_model("mixtral", tmp_path / "hf", torch.float32, hidden_size=128, intermediate_size=256)
    spec = tmp_path / "m.msl"
    assert msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ,
                 "--devices", 4, "--per-node", 4)[0] == 0  # fmt: skip
    mesh = ("mesh.dp=2", "mesh.tp=1", "mesh.pp=2", "mesh.ep=2", "train.zero=1")
    sets = [a for s in mesh for a in ("--set", s)]
    assert msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "whole")[0] == 0
    code, err = msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "ranks", *sets)
    assert code == 0, err
    strategy = json.loads((tmp_path / "ranks" / "rank_0" / "strategy.json").read_text())
    assert any(v["opt_weight_shard_size"] for v in strategy["parallel_layout_item"].values())
    last = ms.load_checkpoint(str(tmp_path / "ranks" / "rank_2" / "model.ckpt"))
    assert "decoder.1.moe.gate" in last and "decoder.0.moe.gate" not in last
    code, err = msgen("ckpt", "merge", spec, tmp_path / "ranks", "-o", tmp_path / "m.ckpt", *sets)
    assert code == 0, err
    whole = ms.load_checkpoint(str(tmp_path / "whole" / "model.ckpt"))
    merged = ms.load_checkpoint(str(tmp_path / "m.ckpt"))
    assert set(merged) == set(whole)
    for name, value in whole.items():
        assert np.array_equal(merged[name].asnumpy(), value.asnumpy()), name
