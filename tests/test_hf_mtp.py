"""DeepSeek-V3's multi-token prediction layer through `import hf`, `ckpt from-hf` and
`ckpt to-hf`. transformers 4.57 builds none (DeepseekV3PreTrainedModel skips
`model.layers.61.*` on load), so the tiny DeepseekV3ForCausalLM of
tests/test_hf_deepseek.py (random weights, q LoRA, yarn, sigmoid routing in groups)
gets one made up as DeepSeek's checkpoints hold it: model.layers.3 (num_hidden_layers
+ 0) with enorm, hnorm, eh_proj [hidden, 2 hidden], shared_head.norm (random, not
ones), a DeepseekV3DecoderLayer of that index (experts, as first_k_dense_replace = 1
makes it; its correction bias random), and embed_tokens and shared_head.head, copies
of the main model's embedding and lm_head; config.json gains
num_nextn_predict_layers = 1.

The oracle of the module's loss is the numpy reference of tests/test_mtp.py
(`module_losses`, written from the paper's equations 21-24) fed from those tensors by
their Hugging Face names: enorm, hnorm, eh_proj and shared_head.norm as they are, the
block run by transformers' own DeepseekV3DecoderLayer, h^0 transformers' final norm
output. Nothing of msgen's mapping is in it.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest

from msgen.hf.tensors import read_header, read_tensor
from tests.oracles import require
from tests.test_ckpt_hf import SEQ, compiled_network, msgen
from tests.test_hf_deepseek import COMMON, hf_model
from tests.test_import_hf import CONFIGS, estimate, imported
from tests.test_mtp import Module, module_losses
from tests.test_op_loss import cross_entropy

torch = require("torch")
transformers = require("transformers")
ms = require("mindspore")
safetensors_torch = require("safetensors.torch")

LAYERS = COMMON["num_hidden_layers"]  # the module is model.layers.3
PREFIX = f"model.layers.{LAYERS}."
COPIES = {  # DeepSeek's copies in the module, and what each copies
    PREFIX + "embed_tokens.weight": "model.embed_tokens.weight",
    PREFIX + "shared_head.head.weight": "lm_head.weight",
}


@pytest.fixture(scope="module", autouse=True)
def pynative():
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")


def with_mtp(folder: Path, dtype=None):
    """The tiny DeepSeek-V3 with a made-up multi-token prediction layer in its
    safetensors (module docstring); transformers' model and the layer's block."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer

    dtype = dtype or torch.float32
    model = hf_model("deepseek_v3", folder, dtype)
    torch.manual_seed(1)
    block = DeepseekV3DecoderLayer(model.config, layer_idx=LAYERS)
    h = model.config.hidden_size
    own = {
        "enorm.weight": 1.0 + 0.3 * torch.randn(h),
        "hnorm.weight": 1.0 + 0.3 * torch.randn(h),
        "eh_proj.weight": 0.2 * torch.randn(h, 2 * h),
        "shared_head.norm.weight": 1.0 + 0.3 * torch.randn(h),
    }
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, 0.2)
        block.mlp.gate.e_score_correction_bias.uniform_(-0.05, 0.05)
    block = block.to(dtype)
    path = folder / "model.safetensors"
    tensors = safetensors_torch.load_file(path)
    tensors |= {PREFIX + n: t.to(dtype).contiguous() for n, t in own.items()}
    tensors |= {PREFIX + n: t.contiguous() for n, t in block.state_dict().items()}
    tensors |= {copy: tensors[source].clone() for copy, source in COPIES.items()}
    safetensors_torch.save_file(tensors, path, metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"num_nextn_predict_layers": 1}))
    return model, block


def converted(tmp_path: Path, *sets: str):
    """import hf -> ckpt from-hf of the tiny model with its module."""
    model, block = with_mtp(tmp_path / "hf")
    spec = tmp_path / "m.msl"
    code, err = msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ)
    assert code == 0, err
    code, err = msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "init", *sets)
    assert code == 0, err
    return model, block, spec


def hf_tensor(folder: Path, name: str) -> np.ndarray:
    return read_tensor(folder / "model.safetensors", name)[0].astype(np.float64)


def reference(model, block, folder: Path, full: np.ndarray) -> tuple[float, float]:
    """(main loss, the module's loss): transformers' model for the main loss and h^0,
    tests/test_mtp.py's module_losses over the layer's tensors for the module (float64),
    its block transformers' DeepseekV3DecoderLayer (in fp32: its router computes in
    fp32 whatever the input)."""
    main = copy.deepcopy(model)
    main.config._attn_implementation = "eager"
    layer = copy.deepcopy(block)
    layer.self_attn.config = main.config
    tokens = torch.tensor(full[:, :-1])
    with torch.no_grad():
        out = main.model(tokens)
        h0 = out.last_hidden_state.double().numpy()  # after the final norm, as lm_head reads
        logits = main.lm_head(out.last_hidden_state).double().numpy()

    def run_block(x: np.ndarray) -> np.ndarray:
        n = x.shape[1]
        xt = torch.tensor(x, dtype=torch.float32)
        positions = torch.arange(n)[None]
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        with torch.no_grad():
            rope = main.model.rotary_emb(xt, positions)
            out = layer(xt, attention_mask=mask, position_ids=positions, position_embeddings=rope)
        return (out[0] if isinstance(out, tuple) else out).double().numpy()

    get = lambda name: hf_tensor(folder, PREFIX + name)  # noqa: E731
    module = Module(
        enorm=get("enorm.weight"),
        hnorm=get("hnorm.weight"),
        eh_proj=get("eh_proj.weight").T,  # nn.Linear [hidden, 2 hidden]: x @ W.T
        block=run_block,
        norm=get("shared_head.norm.weight"),
    )
    table = hf_tensor(folder, "model.embed_tokens.weight")
    head = hf_tensor(folder, "lm_head.weight").T
    (loss,) = module_losses(h0, full, table, head, [module], eps=main.config.rms_norm_eps)
    return float(cross_entropy(logits, full[:, 1:])), float(loss)


def test_the_modules_loss_from_the_checkpoint_equals_the_reference(tmp_path):
    """from-hf puts the layer's tensors where the generated module reads them: its
    loss (log.csv's mtp_loss, the module's `total`) and the network's loss (the main
    loss + 0.1 x it, the weight import writes) equal the reference from the tensors
    by their names, within fp32's error."""
    model, block, spec = converted(tmp_path)
    assert "mtp          = mtp(depth = 1, weight = 0.1)" in spec.read_text()
    net = compiled_network(spec, tmp_path / "gen")
    net.set_train(False)
    saved = ms.load_checkpoint(str(tmp_path / "init" / "model.ckpt"))
    missing, _ = ms.load_param_into_net(net, saved)
    state = ("add_aux.total", "mtp.total")  # zeroed before each step, as the load count
    assert [n for n in missing if n not in state and not n.endswith(".expert_load")] == []
    # the copies are not loaded twice: the module holds no embedding or output layer
    own = sorted(n for n in saved if n.startswith("mtp."))
    assert own == sorted(p.name for p in net.get_parameters() if p.name in own)
    assert not [n for n in own if "emb" in n or "logits" in n or "head" in n]
    full = np.random.default_rng(1).integers(0, COMMON["vocab_size"], (2, SEQ + 1))
    tokens, labels = (ms.Tensor(a, ms.int32) for a in (full[:, :-1], full[:, 1:]))
    loss = float(net(tokens, labels).asnumpy())
    mtp_loss = float(net.mtp.total.asnumpy())
    main, expected = reference(model, block, tmp_path / "hf", full)
    assert mtp_loss == pytest.approx(expected, rel=1e-5)
    assert loss == pytest.approx(main + 0.1 * expected, rel=1e-5)
    assert abs(expected - main) > 0.05  # the module's loss is not the main loss again


def same_tensors(source: Path, back: Path) -> list[str]:
    entries = read_header(source)[0]
    assert set(read_header(back)[0]) == set(entries)  # DeepSeek's key set, copies too
    for name in entries:
        a, a_type = read_tensor(source, name)
        b, b_type = read_tensor(back, name)
        assert a_type == b_type and a.shape == b.shape and np.array_equal(a, b), name
    return sorted(entries)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_to_hf_gives_back_the_layer_and_its_copies_bit_for_bit(tmp_path, dtype):
    with_mtp(tmp_path / "hf", getattr(torch, dtype))
    spec = tmp_path / "m.msl"
    assert msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ)[0] == 0
    assert msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "init")[0] == 0
    code, err = msgen("ckpt", "to-hf", spec, tmp_path / "init", "-o", tmp_path / "back")
    assert code == 0, err
    names = same_tensors(
        tmp_path / "hf" / "model.safetensors", tmp_path / "back" / "model.safetensors"
    )
    assert set(COPIES) <= set(names) and PREFIX + "mlp.gate.e_score_correction_bias" in names
    again = json.loads((tmp_path / "back" / "config.json").read_text())
    assert again["num_nextn_predict_layers"] == 1


MESHES = {
    "dp2_tp2_ep2": ("mesh.dp=2", "mesh.tp=2", "mesh.pp=1", "mesh.ep=2", "train.zero=0"),
    "tp2_pp2": ("mesh.dp=1", "mesh.tp=2", "mesh.pp=2", "mesh.ep=1", "train.zero=0"),
}


@pytest.mark.slow  # 14-33 s a mesh measured: two from-hf runs, to-hf merging 4 ranks
@pytest.mark.parametrize("mesh", sorted(MESHES))
def test_per_rank_slices_of_the_module_merge_back(tmp_path, mesh):
    """On dp 2 x tp 2 with ep 2 the module's block is cut as a main layer (4 of its 8
    experts, half the heads' up-projections per rank), eh_proj column-parallel over
    tp, its correction bias whole on every rank; on tp 2 x pp 2 the module is on the
    last stage's ranks only. to-hf of the ranks gives every source tensor back bit for
    bit, the copies included."""
    with_mtp(tmp_path / "hf")
    spec = tmp_path / "m.msl"
    assert msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ,
                 "--devices", 4, "--per-node", 4)[0] == 0  # fmt: skip
    sets = [a for s in MESHES[mesh] for a in ("--set", s)]
    assert msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "whole")[0] == 0
    code, err = msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "ranks", *sets)
    assert code == 0, err
    whole = ms.load_checkpoint(str(tmp_path / "whole" / "model.ckpt"))
    ranks = [ms.load_checkpoint(str(tmp_path / "ranks" / f"rank_{r}" / "model.ckpt"))
             for r in range(4)]  # fmt: skip
    bias = "mtp.layers.0.block.moe.expert_bias"
    holders = [r for r in range(4) if bias in ranks[r]]
    assert holders == ([0, 1, 2, 3] if mesh == "dp2_tp2_ep2" else [2, 3])
    for r in holders:
        assert np.array_equal(ranks[r][bias].asnumpy(), whole[bias].asnumpy())
        assert ranks[r]["mtp.layers.0.eh_proj.weight"].shape == (128, 32)
    if mesh == "dp2_tp2_ep2":
        assert ranks[3]["mtp.layers.0.block.moe.gate"].shape == (4, 64, 32)
        assert ranks[3]["mtp.layers.0.block.att.kv_b"].shape == (16, 64)
    code, err = msgen("ckpt", "to-hf", spec, tmp_path / "ranks", "-o", tmp_path / "back", *sets)
    assert code == 0, err
    same_tensors(tmp_path / "hf" / "model.safetensors", tmp_path / "back" / "model.safetensors")


@pytest.mark.parametrize("copy_name", sorted(COPIES))
def test_a_copy_that_differs_is_refused_before_writing(tmp_path, copy_name):
    """msgen holds the embedding and the output layer once: a module whose copy is
    not the main model's would lose its values, so from-hf refuses it in one line."""
    with_mtp(tmp_path / "hf")
    path = tmp_path / "hf" / "model.safetensors"
    tensors = safetensors_torch.load_file(path)
    tensors[copy_name][1, 2] += 1.0
    safetensors_torch.save_file(tensors, path, metadata={"format": "pt"})
    spec = tmp_path / "m.msl"
    assert msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ)[0] == 0
    code, err = msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "init")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{copy_name} is not a copy of {COPIES[copy_name]}" in err
    assert not (tmp_path / "init").exists()


def test_a_spec_or_checkpoint_without_the_module_is_one_line(tmp_path):
    """The config's num_nextn_predict_layers against the spec's train.mtp, and against
    the tensors: a checkpoint transformers saved keeps the key and holds no layer."""
    with_mtp(tmp_path / "hf")
    spec = tmp_path / "m.msl"
    assert msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ)[0] == 0
    text = spec.read_text()
    without = tmp_path / "without.msl"
    without.write_text(text.replace("    mtp          = mtp(depth = 1, weight = 0.1)\n", ""))
    code, err = msgen("ckpt", "from-hf", without, tmp_path / "hf", "-o", tmp_path / "a")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "num_nextn_predict_layers = 1, the spec's train.mtp has 0 modules" in err
    path = tmp_path / "hf" / "model.safetensors"
    tensors = safetensors_torch.load_file(path)
    kept = {n: t for n, t in tensors.items() if not n.startswith(PREFIX)}
    safetensors_torch.save_file(kept, path, metadata={"format": "pt"})
    code, err = msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "b")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "num_nextn_predict_layers = 1 names multi-token prediction layers" in err


@pytest.mark.parametrize("tied", [False, True])
def test_the_tables_carry_two_modules_there_and_back(tied):
    """Without transformers or MindSpore: num_nextn_predict_layers = 2 names layers 3
    and 4 (their copies included) and msgen's mtp.layers.0 and .1; from a source whose
    copies are copies, to_hf(to_msgen) is the source exactly. With tied embeddings
    shared_head.head is a copy of the embedding (there is no lm_head)."""
    from msgen.hf.config import model_of
    from msgen.hf.layout import check_copies, hf_shapes, msgen_shapes, to_hf, to_msgen
    from tests.test_hf_mapping import BASE, CONFIGS

    copies = {n: "model.embed_tokens.weight" if tied else s for n, s in COPIES.items()}
    config = {"model_type": "deepseek_v3", **BASE, **CONFIGS["deepseek_v3"]}
    m = model_of(config | {"num_nextn_predict_layers": 2, "tie_word_embeddings": tied})
    rng = np.random.default_rng(0)
    source = {n: rng.standard_normal(s).astype(np.float32) for n, s in hf_shapes(m).items()}
    assert ("lm_head.weight" in source) != tied
    for layer in (3, 4):
        for name, original in copies.items():
            source[name.replace(PREFIX, f"model.layers.{layer}.")] = source[original]
    assert check_copies(m, source.__getitem__) == 4
    converted = dict(to_msgen(m, source.__getitem__))
    assert {n: a.shape for n, a in converted.items()} == msgen_shapes(m)
    assert np.array_equal(
        converted["mtp.layers.1.enorm.gamma"], source["model.layers.4.enorm.weight"]
    )
    assert not [n for n in converted if n.startswith("mtp.") and ("emb" in n or "head" in n)]
    back = dict(to_hf(m, converted.__getitem__))
    assert set(back) == set(source)
    for name, array in source.items():
        assert np.array_equal(back[name], array), name


def test_the_published_deepseek_v3_config_imports_its_module(tmp_path):
    """DeepSeek-V3's config.json (num_nextn_predict_layers = 1) imports with `mtp =
    mtp(depth = 1, weight = 0.1)`, and params_mtp counts the module's own weights
    only (the embedding and the output layer are the main model's), by hand from the
    config (h = 7168, 128 heads, q_lora_rank 1536, kv_lora_rank 512, nope 128, rope
    64, v 128, 256 experts of 2048 and one shared, layer 61 sparse):

    enorm, hnorm, shared_head.norm              3 x 7168              =         21,504
    eh_proj                                     7168 x 14336          =    102,760,448
    the block's norms                           2 x 7168              =         14,336
    q_a 7168 x 1536 + its norm 1536 + q_b 1536 x 128 x 192             =     48,760,320
    kv_a 7168 x 576 + its norm 512 + kv_b 512 x 128 x 256              =     20,906,496
    o_proj 128 x 128 x 7168                                             =    117,440,512
    router 256 x 7168                                                   =      1,835,008
    experts 256 x 3 x 7168 x 2048                                       = 11,274,289,152
    shared expert 3 x 7168 x 2048                                       =     44,040,192
    total                                                               = 11,610,067,968

    (DeepSeek's README_WEIGHTS.md states 11.5 B: the decoder layer alone is
    11,507,286,016.) params_total is transformers' 671,026,404,352 plus it; the
    correction bias is a buffer, in neither."""
    proc, spec = imported(tmp_path, CONFIGS / "deepseek_v3.json")
    assert proc.returncode == 0, proc.stderr
    assert "    mtp          = mtp(depth = 1, weight = 0.1)\n" in spec.read_text()
    doc = estimate(spec)
    assert doc["params_mtp"] == 11_610_067_968
    assert doc["params_total"] == 671_026_404_352 + 11_610_067_968


def test_a_module_layer_of_another_kind_is_refused(tmp_path):
    """first_k_dense_replace = 3 of 3 layers: the main layers dense, layer 3 (the
    module's) with experts, a layer kind the network does not repeat."""
    config = json.loads((CONFIGS / "deepseek_v3.json").read_text())
    config |= {"num_hidden_layers": 3, "first_k_dense_replace": 3}
    proc, spec = imported(tmp_path, config)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "first_k_dense_replace = 3 gives the multi-token prediction layers" in proc.stderr
    assert not spec.exists()


@pytest.mark.slow  # 48-114 s measured: compiling and 3 steps of train.py
def test_train_py_starts_from_the_module_and_to_hf_writes_it_back(tmp_path):
    """import hf -> from-hf -> train.py --init-from, 3 steps -> to-hf of the run: the
    run starts from the checkpoint's module and correction biases (a bias left at
    zero would be up to 0.05 away; the update moves each by at most 3 x bias_rate
    1e-3), logs mtp_loss, and to-hf writes DeepSeek's key set with the copies equal
    to the trained embedding and output layer."""
    import subprocess
    import sys

    with_mtp(tmp_path / "hf")
    spec = tmp_path / "m.msl"
    assert msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ)[0] == 0
    text = spec.read_text().replace("global_batch = 64", "global_batch = 2")
    spec.write_text(text.replace("micro_batches = 64", "micro_batches = 2"))
    assert msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "init")[0] == 0
    assert msgen("compile", spec, "-o", tmp_path / "gen")[0] == 0
    tree = next(p for p in (tmp_path / "gen").iterdir() if p.is_dir())
    run = subprocess.run(
        [sys.executable, "train.py", "--standalone", "--synthetic", "--steps", "3"]
        + ["--init-from", str(tmp_path / "init"), "--output", str(tmp_path / "out")],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "mtp_loss" in (tmp_path / "out" / "rank_0" / "log.csv").read_text().splitlines()[0]
    init = ms.load_checkpoint(str(tmp_path / "init" / "model.ckpt"))
    trained = ms.load_checkpoint(str(sorted((tmp_path / "out" / "rank_0").glob("step_*.ckpt"))[-1]))
    for name in init:
        moved = np.abs(trained[name].asnumpy() - init[name].asnumpy()).max()
        if name.endswith("expert_bias"):
            assert np.abs(init[name].asnumpy()).max() > 0.02 and moved <= 3e-3 + 1e-6, name
        else:
            assert 0 < moved < 1e-3, name  # trained, from the imported weights
    code, err = msgen("ckpt", "to-hf", spec, tmp_path / "out", "--from-hf", tmp_path / "init",
                      "-o", tmp_path / "back")  # fmt: skip
    assert code == 0, err
    source, back = tmp_path / "hf" / "model.safetensors", tmp_path / "back" / "model.safetensors"
    assert set(read_header(back)[0]) == set(read_header(source)[0])
    for copy_name, original in COPIES.items():
        assert np.array_equal(read_tensor(back, copy_name)[0], read_tensor(back, original)[0])
    emb = trained["emb.table"].asnumpy()
    assert np.array_equal(read_tensor(back, PREFIX + "embed_tokens.weight")[0], emb)
