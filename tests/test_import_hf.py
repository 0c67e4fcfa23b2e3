"""`msgen import hf`: a Hugging Face config.json to a spec whose parameter count is the
published model's, every key read, nothing msgen cannot mean accepted silently.

The configs in tests/hf_configs/ are the published ones (the models' config.json on
their model cards). Their parameter counts are the published figures: Llama-2-7B
6,738,415,616; Meta-Llama-3-8B 8,030,261,248; Mistral-7B-v0.1 7,241,732,096; Qwen2-7B
7,615,616,512; Qwen2-0.5B 494,032,768 (tied embeddings).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from msgen.cli import main
from tests.oracles import require

CONFIGS = Path(__file__).parent / "hf_configs"
PUBLISHED = {
    "llama2_7b": 6_738_415_616,
    "llama3_8b": 8_030_261_248,
    "mistral_7b": 7_241_732_096,
    "qwen2_7b": 7_615_616_512,
    "qwen2_0_5b": 494_032_768,
}


def msgen(*args) -> subprocess.CompletedProcess:
    """msgen's main() in this process (the CLI as a user runs it is tested once below)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main([str(a) for a in args])
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def imported(
    tmp_path: Path, config: dict | Path, *extra
) -> tuple[subprocess.CompletedProcess, Path]:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    source = folder / "config.json"
    if isinstance(config, Path):
        source.write_bytes(config.read_bytes())
    else:
        source.write_text(json.dumps(config))
    spec = tmp_path / "model.msl"
    return msgen("import", "hf", source, "-o", spec, *extra), spec


def estimate(spec: Path) -> dict:
    proc = msgen("estimate", "--json", spec)
    return json.loads(proc.stdout)


def base_config(**changes) -> dict:
    """A small LLaMA config, as LlamaConfig writes it."""
    config = {
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": 64,
        "intermediate_size": 160,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 3,
        "vocab_size": 256,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 128,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    config.update(changes)
    return {k: v for k, v in config.items() if v is not None}


def hf_count(c: dict) -> int:
    """Parameters of the Hugging Face model as its modules declare them
    (modeling_llama.py / modeling_qwen2.py / modeling_mistral.py: embed_tokens
    [vocab, hidden]; per layer q_proj [heads*hd, hidden], k_proj and v_proj
    [kv*hd, hidden], o_proj [hidden, heads*hd], gate/up [ffn, hidden], down
    [hidden, ffn], input and post-attention RMSNorm [hidden]; norm [hidden]; lm_head
    [vocab, hidden] unless tied)."""
    h, f, v = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    a = c["num_attention_heads"]
    g = c.get("num_key_value_heads", a)
    hd = c.get("head_dim", h // a)
    qwen2 = c["model_type"] == "qwen2"
    attention_bias = c.get("attention_bias", False)
    q_proj = h * a * hd + (a * hd if qwen2 or attention_bias else 0)
    kv_proj = 2 * (h * g * hd + (g * hd if qwen2 or attention_bias else 0))
    o_proj = a * hd * h + (h if attention_bias and not qwen2 else 0)
    mlp_bias = c.get("mlp_bias", False) and c["model_type"] == "llama"
    mlp = 3 * h * f + ((2 * f + h) if mlp_bias else 0)
    layer = q_proj + kv_proj + o_proj + mlp + 2 * h
    # untied without the key: LlamaConfig, Qwen2Config and MistralConfig default
    # tie_word_embeddings to False (PretrainedConfig's own default, True, is overridden)
    head = 0 if c.get("tie_word_embeddings", False) else v * h
    return v * h + c["num_hidden_layers"] * layer + h + head


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_models_have_their_published_parameter_count(tmp_path, name):
    proc, spec = imported(tmp_path, CONFIGS / f"{name}.json")
    assert proc.returncode == 0, proc.stderr
    assert estimate(spec)["params_total"] == PUBLISHED[name]
    # laid out as msgen fmt lays it out
    assert msgen("fmt", "--check", spec).returncode == 0


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"num_key_value_heads": None},  # absent: equal to heads
        {"head_dim": 32},  # not hidden / heads
        {"attention_bias": True, "mlp_bias": True},
        {"tie_word_embeddings": True},
        {"tie_word_embeddings": None},  # absent: untied, as transformers' configs default
        {"model_type": "qwen2"},  # q/k/v biases with no config key
        {"model_type": "qwen2", "tie_word_embeddings": True},
        {"model_type": "mistral", "sliding_window": 16},
    ],
)
def test_parameter_count_equals_the_hugging_face_modules(tmp_path, changes):
    config = base_config(**changes)
    proc, spec = imported(tmp_path, config)
    assert proc.returncode == 0, proc.stderr
    assert estimate(spec)["params_total"] == hf_count(config)


def test_every_key_reaches_the_spec(tmp_path):
    config = base_config(rms_norm_eps=3e-6, rope_theta=500000.0, head_dim=32)
    proc, spec = imported(tmp_path, config)
    text = spec.read_text()
    assert "eps = 3e-06" in text and "rope_theta = 500000.0" in text
    assert "head_dim    = 32" in text and "kv_heads    = 2" in text
    assert "dtype       = fp32" in text


def test_rope_theta_from_the_transformers_5_form(tmp_path):
    config = base_config(rope_theta=None)
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 1000000.0}
    proc, spec = imported(tmp_path, config)
    assert proc.returncode == 0, proc.stderr
    assert "rope_theta = 1000000.0" in spec.read_text()


def window_of(spec: Path) -> dict[str, str]:
    """layer kind -> the window its attention is given ('' for none)."""
    kinds, kind = {}, None
    for line in spec.read_text().splitlines():
        if line.startswith("layer "):
            kind = line.split()[1]
        if kind and "attention(" in line:
            kinds[kind] = "window = window" in line and "window"
    return kinds


def test_mistral_window_is_on_every_layer(tmp_path):
    proc, spec = imported(tmp_path, base_config(model_type="mistral", sliding_window=16))
    assert window_of(spec) == {"decoder": "window"}
    assert "window      = 16" in spec.read_text()


def test_qwen2_window_is_off_unless_used(tmp_path):
    # many Qwen2 configs carry a sliding_window that use_sliding_window turns off
    config = base_config(model_type="qwen2", sliding_window=16, use_sliding_window=False)
    proc, spec = imported(tmp_path, config)
    assert window_of(spec) == {"decoder": False}


def test_qwen2_window_starts_at_max_window_layers(tmp_path):
    config = base_config(
        model_type="qwen2", sliding_window=16, use_sliding_window=True, max_window_layers=1
    )
    proc, spec = imported(tmp_path, config)
    assert proc.returncode == 0, proc.stderr
    assert window_of(spec) == {"decoder": False, "decoder_swa": "window"}
    text = spec.read_text()
    assert "repeat decoder(emb) 1" in text and "repeat decoder_swa(part1) layers - 1" in text
    assert estimate(spec)["params_total"] == hf_count(config)


def test_layer_types_written_by_transformers_are_read(tmp_path):
    kinds = ["full_attention", "sliding_attention", "sliding_attention"]
    config = base_config(model_type="qwen2", sliding_window=16, layer_types=kinds)
    proc, spec = imported(tmp_path, config)
    assert window_of(spec) == {"decoder": False, "decoder_swa": "window"}


@pytest.mark.parametrize(
    "dtype, compute, params",
    [("float32", "fp32", "fp32"), ("bfloat16", "bf16", "fp32"), (None, "bf16", "fp32")],
)
def test_dtype(tmp_path, dtype, compute, params):
    proc, spec = imported(tmp_path, base_config(torch_dtype=dtype))
    text = spec.read_text()
    assert f"dtype       = {compute}" in text and f"param_dtype = {params}" in text
    assert ("names no dtype" in proc.stderr) == (dtype is None)


def test_seq_beyond_max_positions_is_a_note(tmp_path):
    proc, spec = imported(tmp_path, base_config(), "--seq", 256)
    assert proc.returncode == 0
    assert "beyond max_position_embeddings 128" in proc.stderr


def test_devices_lay_the_spec_out_with_the_planner(tmp_path):
    proc, spec = imported(tmp_path, CONFIGS / "mistral_7b.json", "--devices", 16)
    assert proc.returncode == 0, proc.stderr
    assert "mesh chosen by the planner for 16 devices" in proc.stderr
    check = msgen("check", spec)
    assert check.returncode == 0, check.stderr
    result = estimate(spec)
    assert result["devices"] == 16 and all(s["fits"] for s in result["stages"])


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"model_type": "gemma"}, "model_type 'gemma' is not supported"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
        ({"rms_norm_eps": None}, "config.json: rms_norm_eps: missing"),
        (
            {"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
            "rope_scaling of rope_type 'llama3' lacks low_freq_factor",
        ),
        ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_type 'dynamic' is not"),
        ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e6}}, "'longrope' is not"),
        ({"rope_scaling": {"rope_type": "ntk", "factor": 2.0}}, "rope_type 'ntk' is not"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 0}}, "rope_scaling.factor: `factor`"),
        ({"num_key_value_heads": 3}, "does not divide heads"),
        ({"vocab_size": 0}, "config.json: vocab_size: 0 is outside 1..1099511627775"),
        ({"torch_dtype": "float8"}, "dtype 'float8'"),
        (
            {
                "model_type": "qwen2",
                "sliding_window": 8,
                "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            },
            "mixes full and sliding-window layers",
        ),
    ],
)
def test_what_msgen_cannot_mean_is_refused(tmp_path, changes, message):
    proc, spec = imported(tmp_path, base_config(**changes))
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not spec.exists()


def test_not_a_config(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("[1, 2]")
    proc = msgen("import", "hf", tmp_path / "model" / "config.json")
    assert proc.returncode == 2 and "config.json: expected an object, got a list" in proc.stderr
    proc = msgen("import", "hf", tmp_path / "missing.json")
    assert proc.returncode == 2 and "cannot read" in proc.stderr


def test_an_existing_spec_is_not_replaced_without_force(tmp_path):
    spec = tmp_path / "model.msl"
    spec.write_text("mine\n")
    proc, _ = imported(tmp_path, base_config())
    assert proc.returncode == 2 and "exists" in proc.stderr
    assert spec.read_text() == "mine\n"
    proc, _ = imported(tmp_path, base_config(), "--force")
    assert proc.returncode == 0 and spec.read_text().startswith("# model:")


def test_without_output_the_spec_is_printed_by_the_command(tmp_path):
    (tmp_path / "Qwen2-0.5B").mkdir()
    config = tmp_path / "Qwen2-0.5B" / "config.json"
    config.write_bytes((CONFIGS / "qwen2_0_5b.json").read_bytes())
    proc = subprocess.run(
        [sys.executable, "-m", "msgen.cli", "import", "hf", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "model qwen2_0_5b {" in proc.stdout


TRANSFORMERS_CLASSES = {
    "llama": "LlamaConfig",
    "qwen2": "Qwen2Config",
    "mistral": "MistralConfig",
}


@pytest.mark.parametrize(
    "changes",
    [
        {"head_dim": 32, "attention_bias": True, "mlp_bias": True},
        {"model_type": "qwen2", "tie_word_embeddings": True},
        {"model_type": "mistral", "sliding_window": 16},
        # no key: transformers' own default decides (untied for all three)
        {"tie_word_embeddings": None},
        {"model_type": "qwen2", "tie_word_embeddings": None},
    ],
)
def test_parameter_count_equals_transformers(tmp_path, changes):
    """The count of the model transformers itself builds from the config (the hand
    count above, cross-checked)."""
    transformers = require("transformers")
    config = base_config(**changes)
    kind = getattr(transformers, TRANSFORMERS_CLASSES[config["model_type"]])
    fields = {k: v for k, v in config.items() if k not in ("model_type", "torch_dtype")}
    model = transformers.AutoModelForCausalLM.from_config(kind(**fields))
    built = sum(p.numel() for p in model.parameters())
    proc, spec = imported(tmp_path, config)
    assert estimate(spec)["params_total"] == built == hf_count(config)
