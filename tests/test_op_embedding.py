"""embedding and positions (msgen/ops/embedding.py): their numpy references."""

from __future__ import annotations

REFERENCES = {
    "embedding": lambda op: op.param("table")[op.inputs[0]],
    "positions": lambda op: op.param("table"),  # [seq, hidden], broadcast by `+`
}
