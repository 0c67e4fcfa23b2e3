"""The elementwise ops (msgen/ops/elementwise.py): their numpy references, and what
those must get right for the forward comparison against MindSpore to mean anything."""

from __future__ import annotations

import math

import numpy as np


def gelu(x, approximate: bool):
    if approximate:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def silu(x):
    return x / (1 + np.exp(-x))


def swiglu(op):
    gate, up = np.split(op.inputs[0], 2, axis=-1)
    return silu(gate) * up


def operands(op) -> list:
    """`a + b`, `a * b`: a constant operand is the arg `const`."""
    return op.inputs + ([op.args["const"]] if "const" in op.args else [])


REFERENCES = {
    "gelu": lambda op: gelu(op.inputs[0], op.args.get("approximate", False)),
    "silu": lambda op: silu(op.inputs[0]),
    "swiglu": swiglu,
    "dropout": lambda op: op.inputs[0],  # evaluation: the identity
    "add": lambda op: np.add(*operands(op)),
    "mul": lambda op: np.multiply(*operands(op)),
}


def test_the_two_gelus_are_close_but_not_the_same():
    """tanh GELU approximates the exact (erf) one to about 1e-3 (Hendrycks & Gimpel):
    a reference swapping them would pass a loose comparison, not a 1e-4 one."""
    x = np.linspace(-4, 4, 801)
    gap = np.abs(gelu(x, True) - gelu(x, False)).max()
    assert 1e-4 < gap < 1e-3
    assert gelu(np.array([0.0, 10.0]), False).tolist() == [0.0, 10.0]


def test_silu_is_x_times_its_sigmoid():
    x = np.array([-30.0, -1.0, 0.0, 1.0, 30.0])
    np.testing.assert_allclose(silu(x), x * (1 / (1 + np.exp(-x))))
    assert silu(np.array([0.0]))[0] == 0.0 and abs(silu(np.array([30.0]))[0] - 30.0) < 1e-9
