"""`train.scaled_init` (default true): the output projections of the repeated layers (the
linears feeding a residual `+`) start with std 0.02 / sqrt(2 * layers), as GPT-2 and
Megatron-LM do; every other weight with 0.02."""

from __future__ import annotations

import numpy as np
import pytest

from tests.emit_fixtures import (
    ROOT,
    SPECS,
    compile_spec,
    compiled,
    load,
    network_class,
    plan_json,
)

# Every way a branch may or may not reach the residual stream. Megatron-LM's output
# layers (the attention's `dense` and the MLP's `dense_4h_to_h` take
# scaled_init_method_normal: std / sqrt(2 * layers)) are the linears whose output is
# added to the residual:
# here `proj` (through dropout and a constant scale) and `down`. Not `gate`/`up` (a
# gate `act * up` is not a scale), not `g` (an activation is not a scale), not `side`
# (`side + 1.0` adds a constant, no branch, and `h3 * b` is a gate), not `v` (the
# branch `v * h4` is a gate's product, not a scaled `v`).
BRANCHES = """layer decoder {
    input x : [batch, seq, hidden] @ [dp, 1, 1]
    ln1  = layernorm(x)
    qkv  = linear(ln1, 3 * hidden) weight @ [1, tp]
    att  = attention(qkv, heads = heads, causal = true) @ [dp, 1, tp]
    proj = linear(att, hidden) weight @ [tp, 1]
    d1   = dropout(proj, 0.1)
    s1   = d1 * 0.5
    h    = x + s1
    ln2  = layernorm(h)
    gate = linear(ln2, ffn) weight @ [1, tp]
    up   = linear(ln2, ffn) weight @ [1, tp]
    act  = gelu(gate)
    mlp  = act * up
    down = linear(mlp, hidden) weight @ [tp, 1]
    h2   = h + down
    g    = linear(h2, hidden)
    a2   = gelu(g)
    h3   = h2 + a2
    side = linear(h3, hidden)
    b    = side + 1.0
    h4   = h3 * b
    v    = linear(h4, hidden)
    w    = v * h4
    output h4 + w
}
"""


def test_output_layers_are_the_linears_feeding_a_residual_join():
    from msgen.analysis.plan import build_plan
    from msgen.compiler import analyze_text
    from msgen.emit.build import output_projections

    text = SPECS["tiny"].read_text()
    start = text.index("layer decoder {")
    end = text.index("}\n", start) + 2
    result = analyze_text(text[:start] + BRANCHES + text[end:], "branches.msl", ROOT / "specs")
    assert result.ok, [d.message for d in result.diagnostics]
    plan = build_plan(result.spec, result.facts)
    assert output_projections(plan.graph("decoder")) == {"proj", "down"}


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
