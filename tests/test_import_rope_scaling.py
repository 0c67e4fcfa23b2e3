"""Rope-scaled Hugging Face models, held against transformers' own modelling code:
a LLaMA with Llama 3.1's `llama3` scaling, a Qwen2 with `yarn` (and its attention
factor), a Mistral with `linear`, each built by transformers from a config (every
weight perturbed, norms included) -> `import hf` -> `ckpt from-hf` -> the generated
model's logits equal transformers' (fp32, 1e-4). The scalings are chosen so that every
band kind changes within the test's 32 positions: llama3's original context of 64
keeps band 0, blends band 1 and divides the rest (low_freq_factor 2, not Llama 3.1's 1,
so a formula that ignores it shows); yarn's original 16 interpolates all but band 0."""

from __future__ import annotations

import numpy as np
import pytest

from tests.oracles import require
from tests.test_ckpt_hf import SEQ, compiled_network, hf_model, msgen, msgen_logits

torch = require("torch")
transformers = require("transformers")
ms = require("mindspore")

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
