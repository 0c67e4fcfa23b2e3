"""linear (msgen/ops/linear.py): its numpy reference, own weight [in, out] and bias, or
tied to an embedding's table [vocab, hidden] (x @ table^T); the parameters the op
declares, as docs/language.md defines them; and what the reference must get right,
checked against the definitions written out here, not read from msgen."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from tests.test_estimate import GPT_LAYER, checked, spec_text


def linear(op):
    x = op.inputs[0]
    if op.args.get("tie"):
        return x @ op.param("table", op=op.args["tie"]).T
    out = x @ op.param("weight")
    return out + op.param("bias") if op.args.get("bias", True) else out


REFERENCES = {"linear": linear}


def test_the_parameters_are_the_documented_ones():
    """docs/language.md: `weight: [in, n]`, and `bias: [n]` unless `bias = false`; a
    linear tied to an embedding owns no parameter. hidden 64, ffn 4 x 64 = 256."""
    layer = GPT_LAYER.replace("linear(act, hidden)", "linear(act, hidden, bias = false)")
    facts = checked(spec_text(layer=layer)).facts

    def params(graph: str, op: str) -> dict:
        return {p.name: p.shape for p in facts.graphs[graph].ops[op].params}

    assert params("decoder", "qkv") == {"weight": (64, 192), "bias": (192,)}
    assert params("decoder", "up") == {"weight": (64, 256), "bias": (256,)}
    assert params("decoder", "down") == {"weight": (256, 64)}
    assert params("network", "logits") == {}


def call(x, params: dict, **args):
    """The reference's view of one op named `l` (and of the embedding `emb`)."""
    return SimpleNamespace(
        inputs=[x], args=args, param=lambda name, op=None: params[f"{op or 'l'}.{name}"]
    )


def test_the_reference_sums_over_the_input_dim_and_adds_the_bias_unless_told_not_to():
    """y[b, j] = sum_i x[b, i] w[i, j] + bias[j]: the weight stored [in, out] as msgen
    declares it (torch's nn.Linear stores [out, in] and computes x w^T)."""
    rng = np.random.default_rng(0)
    x, w, b = rng.normal(size=(2, 3)), rng.normal(size=(3, 4)), rng.normal(size=4)
    want = np.array([[sum(x[r, i] * w[i, j] for i in range(3)) for j in range(4)] for r in (0, 1)])
    params = {"l.weight": w, "l.bias": b}
    np.testing.assert_allclose(linear(call(x, params)), want + b, rtol=1e-12)
    no_bias = {"l.weight": w}  # no bias parameter to read
    np.testing.assert_allclose(linear(call(x, no_bias, bias=False)), want, rtol=1e-12)


def test_a_tied_reference_scores_each_token_by_its_embedding_row():
    """Tied, a token's logit is the dot product of the hidden state with that token's
    embedding row (Press & Wolf 2017): with orthonormal rows, the hidden state equal to
    token v's row scores v 1 and every other token 0."""
    table, _ = np.linalg.qr(np.random.default_rng(1).normal(size=(5, 5)))  # [vocab, hidden]
    x = table[[3, 1]]
    logits = linear(call(x, {"emb.table": table}, tie="emb"))
    np.testing.assert_allclose(logits, np.eye(5)[[3, 1]], atol=1e-12)
