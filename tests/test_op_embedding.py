"""embedding and positions (msgen/ops/embedding.py): their numpy references; the
parameters the ops declare, as docs/language.md defines them; and what the references
must get right, checked against definitions written out here, not read from msgen."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from tests.test_estimate import checked, spec_text

REFERENCES = {
    "embedding": lambda op: op.param("table")[op.inputs[0]],
    "positions": lambda op: op.param("table"),  # [seq, hidden], broadcast by `+`
}


def test_the_tables_are_the_documented_ones():
    """docs/language.md: embedding's `table: [vocab, hidden]`, positions' `table: [seq,
    hidden]`. vocab 512, hidden 64, seq 32."""
    ops = checked(spec_text()).facts.graphs["network"].ops
    assert [(p.name, p.shape) for p in ops["emb"].params] == [("table", (512, 64))]
    assert [(p.name, p.shape) for p in ops["pos"].params] == [("table", (32, 64))]


def test_a_lookup_is_the_one_hot_product_with_the_table():
    """Token t's vector is row t of the table: one_hot(tokens) @ table, the product
    whose partial sums a vocab-parallel embedding adds up over its shards (Megatron-LM's
    VocabParallelEmbedding); and the position table is added to every sequence."""
    rng = np.random.default_rng(0)
    table, tokens = rng.normal(size=(7, 3)), np.array([[4, 0, 6], [6, 6, 1]])
    op = SimpleNamespace(inputs=[tokens], param=lambda name: table)
    np.testing.assert_allclose(REFERENCES["embedding"](op), np.eye(7)[tokens] @ table)
    positions = rng.normal(size=(3, 3))  # [seq, hidden]
    pos = REFERENCES["positions"](SimpleNamespace(param=lambda name: positions))
    x = REFERENCES["embedding"](op) + pos
    for b in (0, 1):
        np.testing.assert_allclose(x[b], table[tokens[b]] + positions)
