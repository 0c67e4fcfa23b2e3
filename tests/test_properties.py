"""Property: whatever a spec's text, msgen answers with diagnostics or a clean pass,
never an uncaught exception. The inputs are the shipped specs (specs/*.msl) with
tokens deleted, duplicated, swapped, replaced, and numbers changed."""

from __future__ import annotations

import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msgen.codes import CODES
from msgen.compiler import analyze_text

SPECS_DIR = Path(__file__).resolve().parent.parent / "specs"
SPECS = {p.name: p.read_text() for p in sorted(SPECS_DIR.glob("*.msl"))}

TOKEN = re.compile(
    r'"[^"\n]*"|#[^\n]*|[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?[A-Za-z_0-9]*'
    r"|//|\n|[ \t]+|."
)
NUMBERS = ["0", "1", "-1", "2", "3", "7", "1000000", "1099511627776", "0.5", "1e-9", "1e300",
           "99999999999999999999999", "64", "3e-4", "-0.0"]  # fmt: skip


def tokens(text: str) -> list[str]:
    return TOKEN.findall(text)


def mutations(n_tokens: int):
    index = st.integers(0, n_tokens - 1)
    return st.one_of(
        st.tuples(st.just("delete"), index),
        st.tuples(st.just("duplicate"), index),
        st.tuples(st.just("swap"), index, index),
        st.tuples(st.just("replace"), index, index),
        st.tuples(st.just("number"), index, st.sampled_from(NUMBERS)),
    )


@st.composite
def mutated_specs(draw):
    name = draw(st.sampled_from(sorted(SPECS)))
    toks = tokens(SPECS[name])
    solid = [i for i, t in enumerate(toks) if not t.isspace()]
    numbers = [i for i, t in enumerate(toks) if t[:1].isdigit()]
    for op in draw(st.lists(mutations(len(solid)), min_size=1, max_size=3)):
        kind, i = op[0], solid[op[1] % len(solid)]
        if kind == "delete":
            toks[i] = ""
        elif kind == "duplicate":
            toks[i] = toks[i] + " " + toks[i]
        elif kind == "swap":
            j = solid[op[2] % len(solid)]
            toks[i], toks[j] = toks[j], toks[i]
        elif kind == "replace":
            toks[i] = toks[solid[op[2] % len(solid)]]
        else:
            toks[numbers[op[1] % len(numbers)]] = op[2]
    return name, "".join(toks)


def test_tokens_round_trip():
    for text in SPECS.values():
        assert "".join(tokens(text)) == text


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(mutated_specs())
def test_mutated_specs_get_diagnostics_or_pass(case):
    name, text = case
    result = analyze_text(text, name, SPECS_DIR)  # must not raise
    errors = [d for d in result.diagnostics if d.is_error]
    assert result.ok == (not errors and result.spec is not None)
    if result.spec is None:
        assert errors, "no spec and no error"
    n_lines = len(text.splitlines()) + 1
    for d in result.diagnostics:
        assert d.code in CODES, d
        assert d.message and "Traceback" not in d.message
        if d.span is not None:
            assert d.span.file == name
            assert 1 <= d.span.line <= n_lines and d.span.col >= 1, d
            assert (d.span.end_line, d.span.end_col) >= (d.span.line, d.span.col), d
