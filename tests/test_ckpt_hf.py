"""Hugging Face weights in and out, held against transformers' own modelling code:
`import hf` -> `ckpt from-hf` -> the generated model's logits equal transformers'
(fp32, 1e-4), and `ckpt to-hf` gives back the source tensors bit for bit (fp32 and bf16),
as files transformers loads."""

from __future__ import annotations

import importlib.util
import inspect
import io
import json
import os
import re
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import pytest

from msgen.cli import main
from msgen.hf.tensors import encode, read_header, read_tensor
from tests.oracles import require
from tests.readme_sections import section_commands

torch = require("torch")
transformers = require("transformers")
ms = require("mindspore")

SEQ = 32
MODELS = {
    # GQA: 4 query heads over 2 kv heads
    "llama": ("LlamaConfig", {"num_key_value_heads": 2}),
    # tied embeddings and q/k/v biases
    "qwen2": ("Qwen2Config", {"num_key_value_heads": 2, "tie_word_embeddings": True}),
    # a sliding window shorter than seq
    "mistral": ("MistralConfig", {"num_key_value_heads": 1, "sliding_window": 8}),
    # q/k norms per head, head_dim 32 (not hidden / heads)
    "qwen3": ("Qwen3Config", {"num_key_value_heads": 2, "head_dim": 32}),
    # 4 experts, 2 per token, the top-k weights renormalised
    "mixtral": ("MixtralConfig", {"num_key_value_heads": 2, "num_local_experts": 4}),
    # a dense layer (mlp_only_layers) then a sparse one, the top-k weights as they are
    "qwen3_moe": (
        "Qwen3MoeConfig",
        {
            "num_key_value_heads": 2,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "norm_topk_prob": False,
            "mlp_only_layers": [0],
        },
    ),
    # 4 experts, 2 per token, and the shared expert with its sigmoid gate
    "qwen2_moe": (
        "Qwen2MoeConfig",
        {
            "num_key_value_heads": 2,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 48,
        },
    ),
}


def msgen(*args) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, err.getvalue()


def hf_model(family: str, folder: Path, dtype, **sizes) -> object:
    name, extra = MODELS[family]
    config = getattr(transformers, name)(
        **{"hidden_size": 64, "intermediate_size": 96, **sizes},
        num_attention_heads=4,
        num_hidden_layers=2,
        vocab_size=128,
        max_position_embeddings=SEQ,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        **extra,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # far from uniform logits, so a misplaced weight shows
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    model = model.to(dtype)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def compiled_network(spec: Path, out: Path):
    code, err = msgen("compile", spec, "-o", out)
    assert code == 0, err
    name = next(p for p in out.iterdir() if p.is_dir())
    module_spec = importlib.util.spec_from_file_location(f"m_{id(out)}", name / "model.py")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    network = [
        v
        for v in vars(module).values()
        if isinstance(v, type) and (v.__doc__ or "").startswith("The network:")
    ]
    return network[0]()


def msgen_logits(net, tokens: np.ndarray) -> np.ndarray:
    """emb -> each repeated layer in order -> norm -> logits, as the network's
    construct runs them (without the loss)."""
    return msgen_forward(net, tokens)[0]


def msgen_forward(net, tokens: np.ndarray) -> tuple[np.ndarray, float]:
    """The logits and the layers' auxiliary losses summed, as the network's construct
    computes them (a layer with experts takes and gives the running sum)."""
    x = net.emb(ms.Tensor(tokens, ms.int32))
    aux = ms.Tensor(0.0, ms.float32)
    kinds = re.findall(r"for cell in self\.(\w+):", inspect.getsource(type(net).construct))
    for kind in kinds:
        for cell in getattr(net, kind):
            if len(inspect.signature(cell.construct).parameters) == 2:
                x, aux = cell(x, aux)
            else:
                x = cell(x)
    x = net.norm(x)
    tied = type(net.logits).__name__ == "TiedLinear"
    logits = net.logits(x, net.emb.table) if tied else net.logits(x)
    return logits.asnumpy(), float(aux.asnumpy())


@pytest.fixture(scope="module", autouse=True)
def pynative():
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")


@pytest.mark.parametrize("family", sorted(MODELS))
def test_imported_weights_give_transformers_logits(tmp_path, family):
    model = hf_model(family, tmp_path / "hf", torch.float32)
    spec = tmp_path / "m.msl"
    code, err = msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ)
    assert code == 0, err
    code, err = msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "init")
    assert code == 0, err
    net = compiled_network(spec, tmp_path / "gen")
    missing, _ = ms.load_param_into_net(
        net, ms.load_checkpoint(str(tmp_path / "init" / "model.ckpt"))
    )
    # every weight; the experts' running auxiliary loss is no weight (train.py zeroes
    # it before each step), and from-hf writes none
    assert [n for n in missing if n != "add_aux.total"] == []
    tokens = np.random.default_rng(1).integers(0, 128, size=(2, SEQ))
    with torch.no_grad():
        expected = model(torch.tensor(tokens)).logits.numpy()
    got = msgen_logits(net, tokens)
    assert np.abs(got - expected).max() < 1e-4 * max(1.0, np.abs(expected).max())


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
    assert set(read_header(back)[0]) == set(entries)  # no lm_head.weight when tied
    for name in entries:
        a, a_type = read_tensor(source, name)
        b, b_type = read_tensor(back, name)
        assert a_type == b_type and a.shape == b.shape and np.array_equal(a, b), name
    # transformers loads what to-hf wrote
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back")
    assert again.config.model_type == family


@pytest.mark.parametrize("family", sorted(MODELS))
def test_the_tensors_a_config_gives_are_those_transformers_saves(tmp_path, family):
    """hf_shapes (what to-hf holds source.json's config against): every name and shape
    of the model transformers builds from the config, biases and tied heads included."""
    from msgen.hf.config import model_of, read_config
    from msgen.hf.layout import hf_shapes

    hf_model(family, tmp_path, torch.float32)
    saved = {n: e.shape for n, e in read_header(tmp_path / "model.safetensors")[0].items()}
    assert hf_shapes(model_of(read_config(tmp_path / "config.json"))) == saved


def test_a_transposed_array_is_written_in_its_logical_order(tmp_path):
    """safetensors 0.8.0 writes a non-contiguous array's memory order (upstream
    issue 825); msgen's writer writes the logical order, read back by safetensors."""
    safetensors_numpy = require("safetensors.numpy")
    weight = np.arange(12, dtype=np.float32).reshape(3, 4).T  # a view, not contiguous
    path = tmp_path / "t.safetensors"
    path.write_bytes(b"".join(encode({"w": (weight, "F32")}, {})))
    assert np.array_equal(safetensors_numpy.load_file(str(path))["w"], weight)


def test_a_tensor_of_another_shape_is_refused_before_writing(tmp_path):
    hf_model("llama", tmp_path / "hf", torch.float32)
    spec = tmp_path / "m.msl"
    assert msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ)[0] == 0
    code, err = msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "init",
                      "--set", "model.ffn=128")  # fmt: skip
    assert code == 2 and "decoder.0.gate.weight is [64, 96] here, [64, 128] in the spec" in err
    assert not (tmp_path / "init").exists()


def test_a_missing_shard_is_named(tmp_path):
    hf_model("llama", tmp_path / "hf", torch.float32)
    spec = tmp_path / "m.msl"
    assert msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ)[0] == 0
    index = {"weight_map": {"model.embed_tokens.weight": "model-00002-of-00002.safetensors"}}
    (tmp_path / "hf" / "model.safetensors.index.json").write_text(json.dumps(index))
    code, err = msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "init")
    assert code == 2 and "missing shard" in err and "model-00002-of-00002" in err


def test_another_models_weights_are_refused(tmp_path):
    hf_model("llama", tmp_path / "hf", torch.float32)
    hf_model("qwen2", tmp_path / "other", torch.float32)
    spec = tmp_path / "m.msl"
    assert msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ)[0] == 0
    code, err = msgen("ckpt", "from-hf", spec, tmp_path / "other", "-o", tmp_path / "init")
    assert code == 2 and "not a parameter of the spec" in err
    assert "Traceback" not in err and not (tmp_path / "init").exists()


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "qwen2_moe"])
def test_trained_from_hf_weights_goes_back_to_transformers(tmp_path, family):
    """import hf -> from-hf -> train.py --init-from, 3 steps -> to-hf: transformers loads
    the result, and its logits equal the generated model's with the trained weights
    (a mixture of experts' run also holds its auxiliary-loss total, which is no
    weight)."""
    import subprocess

    hf_model(family, tmp_path / "hf", torch.float32)
    spec = tmp_path / "m.msl"
    assert msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ)[0] == 0
    text = spec.read_text().replace("global_batch = 64", "global_batch = 2")
    spec.write_text(text.replace("micro_batches = 64", "micro_batches = 2"))
    assert msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "init")[0] == 0
    net = compiled_network(spec, tmp_path / "gen")
    tree = next(p for p in (tmp_path / "gen").iterdir() if p.is_dir())
    run = subprocess.run(
        [sys.executable, "train.py", "--standalone", "--synthetic", "--steps", "3"]
        + ["--init-from", str(tmp_path / "init"), "--output", str(tmp_path / "out")],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    code, err = msgen("ckpt", "to-hf", spec, tmp_path / "out", "--from-hf", tmp_path / "init",
                      "-o", tmp_path / "back")  # fmt: skip
    assert code == 0, err
    trained = ms.load_checkpoint(str(sorted((tmp_path / "out" / "rank_0").glob("step_*.ckpt"))[-1]))
    init = ms.load_checkpoint(str(tmp_path / "init" / "model.ckpt"))
    # trained from the imported weights (3 warm-up steps move them by ~1e-6; a random
    # start is ~0.2 away), and trained: they moved
    moved = [np.abs(trained[n].asnumpy() - init[n].asnumpy()).max() for n in init]
    assert max(moved) < 1e-3 and max(moved) > 0
    ms.load_param_into_net(net, trained)
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back")
    tokens = np.random.default_rng(2).integers(0, 128, size=(2, SEQ))
    with torch.no_grad():
        expected = again(torch.tensor(tokens)).logits.numpy()
    got = msgen_logits(net, tokens)
    assert np.abs(got - expected).max() < 1e-4 * max(1.0, np.abs(expected).max())


def test_a_tensor_its_shard_does_not_hold_is_named(tmp_path):
    hf_model("llama", tmp_path / "hf", torch.float32)
    spec = tmp_path / "m.msl"
    assert msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ)[0] == 0
    names = read_header(tmp_path / "hf" / "model.safetensors")[0]
    weight_map = {n: "model.safetensors" for n in names}
    weight_map["model.norm.weight"] = "extra.safetensors"  # the index says so; the file not
    extra = encode({"x": (np.zeros(2, np.float32), "F32")}, {})
    (tmp_path / "hf" / "extra.safetensors").write_bytes(b"".join(extra))
    index = {"weight_map": weight_map}
    (tmp_path / "hf" / "model.safetensors.index.json").write_text(json.dumps(index))
    code, err = msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "init")
    assert code == 2 and "model.norm.weight is not in" in err and "Traceback" not in err
    assert not (tmp_path / "init").exists()


def readme_section_commands() -> list[str]:
    """The commands README's "Start from a Hugging Face model" prints, in order."""
    return section_commands("Start from a Hugging Face model")


@pytest.mark.slow
def test_the_readme_hugging_face_section_runs_as_printed(tmp_path):
    """Each command of the section, as printed, in a folder holding a small LLaMA saved
    by transformers as `my-llama/` and a small Qwen3-MoE as `my-moe/`: the trained model
    comes back to transformers, the run resharded for tp = 2 merges back into the run's
    own checkpoint, and the experts' per-rank slices on ep 2 x tp 2 merge back into
    the source's experts, stacked."""
    import subprocess

    hf_model("llama", tmp_path / "my-llama", torch.float32)
    hf_model("qwen3_moe", tmp_path / "my-moe", torch.float32)
    commands = readme_section_commands()
    assert [c.split()[:3] for c in commands][5:7] == [["msgen", "ckpt", "merge"],
                                                     ["msgen", "ckpt", "reshard"]]  # fmt: skip
    root = str(Path(__file__).resolve().parents[1])
    # msgen and python of this environment (with this checkout's msgen) first on PATH
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    for command in commands:
        done = subprocess.run(
            ["bash", "-c", command], cwd=tmp_path, capture_output=True, text=True,
            timeout=900, env={**os.environ, "PYTHONPATH": root, "PATH": path},
        )  # fmt: skip
        assert done.returncode == 0, (command, done.stderr[-3000:])
    again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "my-llama-trained")
    assert again.config.model_type == "llama"
    merged = ms.load_checkpoint(str(tmp_path / "merged.ckpt"))
    assert int(merged["step"].asnumpy()) == 3 and any(n.startswith("adam_v.") for n in merged)
    tp2 = tmp_path / "run-tp2"
    assert sorted(p.name for p in tp2.iterdir()) == ["rank_0", "rank_1"]
    sets = ("--set", "cluster.per_node=2", "--set", "mesh.tp=2")
    code, err = msgen("ckpt", "merge", tmp_path / "my_llama.msl", tp2, "-o", tmp_path / "b.ckpt",
                      *sets)  # fmt: skip
    assert code == 0, err
    back = ms.load_checkpoint(str(tmp_path / "b.ckpt"))
    assert set(back) == set(merged)
    for name, value in merged.items():
        assert np.array_equal(back[name].asnumpy(), value.asnumpy()), name
    experts = ms.load_checkpoint(str(tmp_path / "moe-merged.ckpt"))["decoder_moe.0.moe.gate"]
    source = tmp_path / "my-moe" / "model.safetensors"
    stacked = [read_tensor(source, f"model.layers.1.mlp.experts.{e}.gate_proj.weight")[0].T
               for e in range(4)]  # fmt: skip
    assert np.array_equal(experts.asnumpy(), np.stack(stacked))
