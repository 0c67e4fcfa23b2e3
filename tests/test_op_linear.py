"""linear (msgen/ops/linear.py): its numpy reference, own weight [in, out] and bias, or
tied to an embedding's table [vocab, hidden] (x @ table^T)."""

from __future__ import annotations


def linear(op):
    x = op.inputs[0]
    if op.args.get("tie"):
        return x @ op.param("table", op=op.args["tie"]).T
    out = x @ op.param("weight")
    return out + op.param("bias") if op.args.get("bias", True) else out


REFERENCES = {"linear": linear}
