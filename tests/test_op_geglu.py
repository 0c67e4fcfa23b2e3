"""geglu, the op added by its module alone (msgen/ops/geglu.py, its template fragment
templates/ops/geglu.py.j2, its docs section) and its tests here: its numpy reference,
shape rule, what it saves; its code is run against the reference op by op in
test_ops.py, and in test_generated's forward, through tests/specs/tiny_mixed.msl."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from msgen.compiler import analyze_text
from msgen.emit.ops import EMITTERS
from msgen.ops import CALLABLE
from tests.test_op_elementwise import gelu

SPEC = Path(__file__).resolve().parent / "specs" / "tiny_mixed.msl"


def geglu(op):
    gate, up = np.split(op.inputs[0], 2, axis=-1)
    return gelu(gate, approximate=False) * up


REFERENCES = {"geglu": geglu}


def checked(text: str):
    return analyze_text(text, "spec.msl", SPEC.parent)


def test_geglu_is_in_the_registry():
    assert "geglu" in CALLABLE and EMITTERS["geglu"].helpers == ("geglu",)


def test_geglu_halves_the_last_dim_and_saves_its_input():
    result = checked(SPEC.read_text())
    assert result.ok, [d.message for d in result.diagnostics]
    block = result.facts.graphs["block"]
    assert block.shapes["gg"] == block.shapes["sw"][:-1] + (block.shapes["sw"][-1] // 2,)
    (saved,) = block.ops["gg"].saves
    assert saved.shape == block.shapes["sw"]


def test_an_odd_width_is_msl119():
    text = SPEC.read_text().replace(
        "gg   = geglu(sw)", "odd  = linear(sw, 7)\n    gg   = geglu(odd)"
    )
    result = checked(text)
    errors = [d for d in result.diagnostics if d.is_error]
    assert [d.code for d in errors] == ["MSL119"]
    assert "geglu needs an even last dim" in errors[0].message
