"""Rope-scaled Hugging Face models, held against transformers' own modelling code:
a LLaMA with Llama 3.1's `llama3` scaling, a Qwen2 with `yarn` (and its attention
factor), a Mistral with `linear`, each built by transformers from a config (every
weight perturbed, norms included) -> `import hf` -> `ckpt from-hf` -> the generated
model's logits equal transformers' (fp32, 1e-4), and `ckpt to-hf` gives the tensors
and the scaling back. The scalings are chosen so that every band kind changes within
the test's 32 positions: llama3's original context of 64 keeps band 0, blends band 1
and divides the rest (low_freq_factor 2, not Llama 3.1's 1, so a formula that ignores
it shows); yarn's original 16 interpolates all but band 0."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout

import numpy as np
import pytest

from msgen.cli import main
from tests.oracles import require
from tests.test_ckpt_hf import SEQ, compiled_network, hf_model, msgen, msgen_logits

torch = require("torch")
transformers = require("transformers")
ms = require("mindspore")
load_file = require("safetensors.torch").load_file

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 2.0,
    "high_freq_factor": 8.0,
    "original_max_position_embeddings": 64,
}
YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
LINEAR = {"rope_type": "linear", "factor": 4.0}
SCALED = {"llama": LLAMA3, "qwen2": YARN, "mistral": LINEAR}


@pytest.fixture(scope="module", autouse=True)
def pynative():
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")


@pytest.mark.parametrize("family", sorted(SCALED))
def test_rope_scaled_models_give_transformers_logits(tmp_path, family):
    model = hf_model(family, tmp_path / "hf", torch.float32, rope_scaling=dict(SCALED[family]))
    spec = tmp_path / "m.msl"
    code, err = msgen("import", "hf", tmp_path / "hf" / "config.json", "-o", spec, "--seq", SEQ)
    assert code == 0, err
    assert f"rope_scaling = {SCALED[family].get('rope_type', 'yarn')}(" in spec.read_text()
    code, err = msgen("ckpt", "from-hf", spec, tmp_path / "hf", "-o", tmp_path / "init")
    assert code == 0, err
    net = compiled_network(spec, tmp_path / "gen")
    missing, _ = ms.load_param_into_net(
        net, ms.load_checkpoint(str(tmp_path / "init" / "model.ckpt"))
    )
    assert not missing
    tokens = np.random.default_rng(1).integers(0, 128, size=(2, SEQ))
    with torch.no_grad():
        expected = model(torch.tensor(tokens)).logits.numpy()
        # the scaling matters here: the same weights under plain rope give other logits
        model.config.rope_scaling = None
        plain = type(model)(model.config)
        plain.load_state_dict(model.state_dict())
        unscaled = plain(torch.tensor(tokens)).logits.numpy()
    got = msgen_logits(net, tokens)
    scale = max(1.0, np.abs(expected).max())
    assert np.abs(unscaled - expected).max() > 1e-2 * scale
    assert np.abs(got - expected).max() < 1e-4 * scale
    # and back: the same tensors, and a config.json that keeps the scaling
    code, err = msgen("ckpt", "to-hf", spec, tmp_path / "init", "-o", tmp_path / "back")
    assert code == 0, err
    source = load_file(str(tmp_path / "hf" / "model.safetensors"))
    back = load_file(str(tmp_path / "back" / "model.safetensors"))
    assert sorted(source) == sorted(back)
    assert all(torch.equal(source[name], back[name]) for name in source)
    configs = [json.loads((tmp_path / d / "config.json").read_text()) for d in ("hf", "back")]
    assert configs[1]["rope_scaling"] == configs[0]["rope_scaling"]


# The published config.json of each model (its model card), the keys import hf reads.
LLAMA_3_1_8B = {
    "model_type": "llama",
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "attention_bias": False,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}
LLAMA_3_2_1B = {
    **LLAMA_3_1_8B,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "head_dim": 64,
    "rope_scaling": {**LLAMA_3_1_8B["rope_scaling"], "factor": 32.0},
    "tie_word_embeddings": True,
}
# Qwen2.5-7B, with the rope_scaling its model card adds for contexts beyond 32,768 tokens
QWEN2_5_7B = {
    "model_type": "qwen2",
    "hidden_act": "silu",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "max_position_embeddings": 131072,
    "max_window_layers": 28,
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"},
    "sliding_window": 131072,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "vocab_size": 152064,
}
PUBLISHED = {
    "llama_3_1_8b": (LLAMA_3_1_8B, "LlamaConfig", "llama3(factor = 8.0, low_freq_factor = 1.0"),
    "llama_3_2_1b": (LLAMA_3_2_1B, "LlamaConfig", "llama3(factor = 32.0, low_freq_factor = 1.0"),
    "qwen2_5_7b": (
        QWEN2_5_7B,
        "Qwen2Config",
        "yarn(factor = 4.0, original_max_position_embeddings",
    ),
}


def imported(tmp_path, config: dict, *extra):
    (tmp_path / "m").mkdir(exist_ok=True)
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    spec = tmp_path / "m.msl"
    return (*msgen("import", "hf", tmp_path / "m" / "config.json", "-o", spec, *extra), spec)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_rope_scaled_configs_import_with_transformers_parameter_count(tmp_path, name):
    config, cls, scaling = PUBLISHED[name]
    code, err, spec = imported(tmp_path, config)
    assert code == 0, err
    assert scaling in spec.read_text()
    assert msgen("fmt", "--check", spec)[0] == 0  # laid out as msgen fmt lays it out
    hf = {k: v for k, v in config.items() if k != "model_type"}
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls)(**hf))
    want = sum(p.numel() for p in model.parameters())  # tied: counted once
    code, out = msgen_out("estimate", "--json", spec)
    assert code in (0, 1)  # 1: over one device's budget, the report printed all the same
    assert json.loads(out)["params_total"] == want


def msgen_out(*args) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        code = main([str(a) for a in args])
    return code, out.getvalue()


def test_the_transformers_5_form_imports_as_the_4_form(tmp_path):
    """transformers 5 writes rope_parameters (rope_theta inside) for rope_scaling."""
    old = tmp_path / "old"
    new = tmp_path / "new"
    old.mkdir(), new.mkdir()
    _, _, old_spec = imported(old, LLAMA_3_1_8B)
    v5 = {k: v for k, v in LLAMA_3_1_8B.items() if k not in ("rope_scaling", "rope_theta")}
    v5["rope_parameters"] = {**LLAMA_3_1_8B["rope_scaling"], "rope_theta": 500000.0}
    code, err, new_spec = imported(new, v5)
    assert code == 0, err
    # the first line names the config's path
    assert new_spec.read_text().split("\n", 1)[1] == old_spec.read_text().split("\n", 1)[1]


def test_yarn_without_its_original_context_takes_max_position_embeddings(tmp_path):
    """transformers' fallback (_compute_yarn_parameters)."""
    config = {**QWEN2_5_7B, "rope_scaling": {"type": "yarn", "factor": 4.0}}
    code, err, spec = imported(tmp_path, config)
    assert code == 0, err
    assert "original_max_position_embeddings = 131072" in spec.read_text()
    del config["max_position_embeddings"]
    code, err, spec = imported(tmp_path, config, "--force")
    assert code == 2 and "rope_scaling of rope_type 'yarn' lacks original_max_position" in err


def test_scaling_changes_neither_the_estimate_nor_the_flops(tmp_path):
    """Scaling changes rope's frequencies only: same shapes, memory, time and FLOPs."""
    plain = tmp_path / "plain.msl"
    scaled = tmp_path / "scaled.msl"
    code, err, spec = imported(tmp_path, LLAMA_3_1_8B, "--seq", 8192, "--devices", 8)
    assert code == 0, err
    text = spec.read_text()
    scaled.write_text(text)
    start = text.index(", rope_scaling = ")
    plain.write_text(text[:start] + text[text.index(")", start) + 1 :])
    assert "rope_scaling" not in plain.read_text()
    reports = []
    for path in (plain, scaled):
        code, out = msgen_out("estimate", "--json", path)
        assert code in (0, 1)
        reports.append(json.loads(out))
    assert reports[0] == reports[1]
    assert reports[0]["time"]["model_flops_per_step"] > 0
