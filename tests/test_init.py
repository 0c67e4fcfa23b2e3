"""`train.scaled_init` (default true): the output projections of the repeated layers (the
linears feeding a residual `+`) start with std 0.02 / sqrt(2 * layers), as GPT-2 and
Megatron-LM do; every other weight with 0.02."""

from __future__ import annotations

import numpy as np
import pytest

from tests.emit_fixtures import SPECS, compile_spec, compiled, load, network_class, plan_json


def weight_stds(folder) -> dict[str, float]:
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE)
    doc = __import__("json").loads((folder / "plan.json").read_text())
    network = network_class(load(folder, "model"), doc)()
    return {
        p.name: float(np.std(p.asnumpy()))
        for p in network.get_parameters()
        if p.name.endswith(".weight")
    }


@pytest.mark.parametrize(
    "name, projections", [("tiny", ("proj", "down")), ("tiny_llama", ("o", "down"))]
)
def test_output_projections_start_scaled_by_depth(name, projections):
    layers = plan_json(name)["layers"]["decoder"]["count"]
    stds = weight_stds(compiled(name))
    for path, std in stds.items():
        op = path.split(".")[-2]
        want = 0.02 / (2 * layers) ** 0.5 if op in projections else 0.02
        assert abs(std - want) < 0.1 * want, (path, std, want)


def test_scaled_init_false_keeps_0_02(tmp_path):
    folder = compile_spec(SPECS["tiny"], tmp_path, "--set", "train.scaled_init=false")
    assert "std=" not in (folder / "model.py").read_text().split("class Decoder")[1]
    for path, std in weight_stds(folder).items():
        assert abs(std - 0.02) < 0.002, (path, std)


def test_train_py_caps_device_memory_at_the_budget(tmp_path):
    """The memory pool's maximum (ms.runtime.set_memory, mindspore/runtime/memory.py) is the
    spec's budget: 58 GiB by default on ascend910b, or budget.device_memory."""
    assert 'set_memory(max_size="58GB")' in (compiled("tiny") / "train.py").read_text()
    folder = compile_spec(SPECS["tiny"], tmp_path, "--set", "budget.device_memory=54.5 GiB")
    assert 'set_memory(max_size="54.5GB")' in (folder / "train.py").read_text()
