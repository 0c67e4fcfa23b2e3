"""The moe op's generated code (templates/ops/moe.py.j2) run by MindSpore on the CPU
against its numpy reference (tests/test_op_moe.py), op by op as tests/test_ops.py runs
the tiny specs' ops: tests/specs/tiny_moe.msl (swiglu, softmax, dropless, a shared
expert, q/k norms), and the same spec with the other choices (gelu, sigmoid, no
renormalisation, a capacity dropping by probability or by position)."""

from __future__ import annotations

import pytest

from tests import emit_fixtures
from tests.test_ops import test_each_op_computes_its_reference as computes_its_reference

VARIANTS = {
    "tiny_moe": "",
    "tiny_moe_gelu_sigmoid": "activation = gelu, router = sigmoid, norm_topk = false, ",
    "tiny_moe_capacity_probs": "capacity = 0.5, ",
    "tiny_moe_capacity_position": "capacity = 0.5, drop = position, norm_topk = false, ",
}


@pytest.fixture(params=sorted(VARIANTS))
def variant(request, tmp_path, monkeypatch):
    name = request.param
    if VARIANTS[name]:
        text = emit_fixtures.SPECS["tiny_moe"].read_text()
        path = tmp_path / f"{name}.msl"
        path.write_text(text.replace("aux_loss = 0.01", VARIANTS[name] + "aux_loss = 0.01"))
        monkeypatch.setitem(emit_fixtures.SPECS, name, path)
    return name


def test_moe_code_computes_its_reference(variant):
    computes_its_reference(variant)
