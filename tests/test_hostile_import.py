"""`msgen import hf` on a config.json that lies: values of the wrong type (unhashable
ones where a name is looked up, strings where a flag or a count is read), numbers no
count can be (400 digits, beyond the language's 2^40), nesting no config has, and a
config path that would break the spec's header comment. Each is one line naming the
file and the key (exit 2), never a traceback and never a spec written from a value
msgen guessed (`"false"` is not false)."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from msgen.cli import main

CONFIGS = Path(__file__).parent / "hf_configs"
DEEP = "[" * 100_000 + "]" * 100_000


def imported(folder: Path, text: str) -> tuple[int, str, Path]:
    """(exit status, stderr, the -o spec) of `import hf` on config.json holding `text`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(text)
    spec = folder.parent / "out.msl"
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        status = main(["import", "hf", str(folder / "config.json"), "-o", str(spec)])
    return status, err.getvalue(), spec


def config(base: str, **changes) -> str:
    """A published config (tests/hf_configs) with keys set to raw JSON text."""
    doc = json.loads((CONFIGS / f"{base}.json").read_text())
    doc.update({k: "@" + k for k in changes})
    text = json.dumps(doc)
    for key, raw in changes.items():
        text = text.replace(json.dumps("@" + key), raw)
    return text


# (published config, key, its raw JSON value, what the one line says after the key)
LIES = [
    ("qwen2_0_5b", "model_type", '["qwen2"]', "expected a string, got a list"),
    ("qwen2_0_5b", "torch_dtype", '{"a": 1}', "expected a string, got an object"),
    ("qwen2_0_5b", "dtype", '["bfloat16"]', "expected a string, got a list"),
    ("qwen2_0_5b", "rms_norm_eps", "9" * 400, "an integer of 400 digits"),
    ("qwen2_0_5b", "rope_theta", "1" + "0" * 400, "an integer of 401 digits"),
    ("qwen2_0_5b", "hidden_size", "9" * 400, "an integer of 400 digits"),
    ("qwen2_0_5b", "num_hidden_layers", "1" + "0" * 399, "an integer of 400 digits"),
    ("qwen2_0_5b", "vocab_size", str(2**40), "1099511627776 is outside 1..1099511627775"),
    ("qwen2_0_5b", "max_position_embeddings", '"4096"', "expected an integer, got a string"),
    ("qwen2_0_5b", "max_position_embeddings", "0", "0 is outside 1..1099511627775"),
    ("qwen2_0_5b", "tie_word_embeddings", '"false"', "expected true or false, got a string"),
    ("qwen2_0_5b", "use_sliding_window", '"false"', "expected true or false, got a string"),
    ("llama2_7b", "attention_bias", '"false"', "expected true or false, got a string"),
    ("llama2_7b", "mlp_bias", "0", "expected true or false, got an integer"),
    ("llama2_7b", "rope_scaling", '{"rope_type": ["llama3"]}', "expected a string, got a list"),
    ("llama2_7b", "head_dim", "true", "expected an integer, got a boolean"),
    ("mistral_7b", "sliding_window", "4096.0", "expected an integer, got a number"),
    ("mistral_7b", "layer_types", "[{}]", "expected a string, got an object"),
    ("mistral_7b", "num_key_value_heads", "NaN", "NaN is not JSON"),
    ("mistral_7b", "rms_norm_eps", "-Infinity", "-Infinity is not JSON"),
    ("mistral_7b", "rope_parameters", DEEP, "nested deeper than 64 levels"),
]


@pytest.mark.parametrize("base, key, raw, says", LIES, ids=[f"{k}={r[:12]}" for _, k, r, _ in LIES])
def test_a_lying_value_is_one_line_naming_the_file_and_the_key(tmp_path, base, key, raw, says):
    status, err, spec = imported(tmp_path / "model", config(base, **{key: raw}))
    path = str(tmp_path / "model" / "config.json")
    assert status == 2 and not spec.exists(), err
    assert err.startswith(f"msgen: error: {path}: ") and says in err
    # the key, unless the reader refused the text before there were keys
    assert key in err or "JSON" in err or "nested" in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_a_default_transformers_reads_from_null_is_still_the_default(tmp_path):
    """null is transformers' "absent" for these keys (LlamaConfig: num_key_value_heads
    None -> the heads; head_dim None -> hidden / heads): the spec is the config's."""
    plain = imported(tmp_path / "a" / "model", config("llama2_7b"))
    nulls = imported(
        tmp_path / "b" / "model",
        config("llama2_7b", num_key_value_heads="null", head_dim="null", rope_scaling="null"),
    )
    assert plain[0] == nulls[0] == 0, (plain[1], nulls[1])
    body = [s[2].read_text().split("\n", 1)[1] for s in (plain, nulls)]  # below the path
    assert body[0] == body[1]


def test_a_null_head_dim_still_needs_heads_to_divide_hidden(tmp_path):
    """head_dim null is hidden / heads, so hidden must be a multiple of the heads: a
    null must not skip that check (it did: the head_dim was the floor, silently)."""
    text = config("llama2_7b", head_dim="null", num_attention_heads="30", num_key_value_heads="30")
    status, err, spec = imported(tmp_path / "model", text)
    assert status == 2 and "hidden_size 4096 is not a multiple of 30 heads" in err, err
    assert str(tmp_path / "model" / "config.json") in err and not spec.exists()


@pytest.mark.parametrize("name", ["a\nmodel {", "b\x1b[2J", "c\u2028d"])
def test_a_config_path_with_a_line_break_or_an_escape_is_quoted_in_the_spec(tmp_path, name):
    """The path is written into the spec's first comment: quoted printably, it stays
    one comment line and the spec parses (it was an internal error)."""
    status, err, spec = imported(tmp_path / name, config("qwen2_0_5b"))
    assert status == 0, err
    header = spec.read_text().splitlines()[0]
    assert header.startswith("# ") and header.endswith("(qwen2 family, 494,032,768 parameters).")
    assert name.encode("unicode_escape").decode() in header


@pytest.mark.parametrize("folder", ["case", "class", "Parameter"])
def test_a_folder_named_like_a_python_or_mindspore_name_gives_a_usable_model_name(tmp_path, folder):
    """The model is named after the config's folder; a keyword or a name the generated
    code uses cannot name it (MSL125), so it gets the `m_` prefix. With --devices the
    planner ran on the spec that MSL125 stopped and raised KeyError (exit 70)."""
    (tmp_path / folder).mkdir()
    (tmp_path / folder / "config.json").write_text(config("qwen2_0_5b"))
    err = io.StringIO()
    argv = ["import", "hf", str(tmp_path / folder / "config.json"), "-o", str(tmp_path / "m.msl")]
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        status = main([*argv, "--devices", "2", "--per-node", "2"])
    assert status == 0, err.getvalue()
    assert f"\nmodel m_{folder.lower()} {{\n" in (tmp_path / "m.msl").read_text()
    assert "mesh chosen by the planner for 2 devices" in err.getvalue()


def test_a_config_msgen_cannot_mean_is_a_usage_error_wherever_it_is_read(tmp_path):
    """from-hf keeps the config in source.json, and to-hf reads it back: a config
    there that msgen cannot mean is the same one line (status 2), not an uncaught
    error (it was exit 70: only import hf turned the refusal into a usage error)."""
    status, err, spec = imported(tmp_path / "model", config("qwen2_0_5b"))
    assert status == 0, err
    (tmp_path / "init").mkdir()
    source = {"config": json.loads(config("qwen2_0_5b", hidden_act='"gelu"')), "dtypes": {}}
    (tmp_path / "init" / "source.json").write_text(json.dumps(source))
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        status = main(
            ["ckpt", "to-hf", str(spec), str(tmp_path / "init"), "-o", str(tmp_path / "o")]
        )
    assert status == 2 and "hidden_act 'gelu' is not supported" in err.getvalue(), err.getvalue()
    assert len(err.getvalue().splitlines()) == 1
