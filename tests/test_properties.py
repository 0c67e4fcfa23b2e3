"""Property: whatever a spec's text, msgen answers with diagnostics or a clean pass,
never an uncaught exception. The inputs are the shipped specs mutated by the one
mutation fuzzer (tests/mutations.py), driven by hypothesis."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from msgen.codes import CODES
from msgen.compiler import analyze_text
from tests.mutations import ROOT, SPECS, TOKEN, mutate

SPECS_DIR = ROOT / "specs"


@st.composite
def mutated_specs(draw):
    name = draw(st.sampled_from(sorted(SPECS)))
    return name, mutate(SPECS[name], draw(st.randoms(use_true_random=False)))


def test_tokens_round_trip():
    for text in SPECS.values():
        assert "".join(TOKEN.findall(text)) == text


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
