"""The generated Python is in black's layout without black running at compile time
(msgen/emit/layout.py): every tree is a fixed point of the pinned black, compiling
it never imports black, and the splits of the layout module equal black's own on
statements of the shapes it takes, generated at random."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import black
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msgen.emit.layout import format_python, lay_out

REPO = Path(__file__).resolve().parent.parent
SPECS = sorted(
    str(p.relative_to(REPO))
    for folder in ("specs", "specs/validation", "tests/specs")
    for p in (REPO / folder).glob("*.msl")
)
# Overrides that reach the templates' branches the specs themselves leave out.
VARIANTS = [
    ("specs/tiny.msl", "pipeline.schedule=gpipe"),
    ("specs/tiny.msl", "train.zero=0"),
    ("tests/specs/tiny_dp.msl", "train.loss_scale=1024"),
    ("tests/specs/tiny_dp.msl", "train.loss_scale=none"),
    ("tests/specs/tiny_mixed.msl", "train.zero=1"),
]
CASES = [(spec, None) for spec in SPECS] + VARIANTS
MODE = black.Mode(target_versions={black.TargetVersion.PY311})


def _black(source: str) -> str:
    return black.format_str(source, mode=MODE)


@pytest.fixture(scope="module")
def trees() -> dict[str, dict]:
    """Every spec that compiles, emitted in a fresh process: its Python files, and
    whether black was imported on the way."""
    script = textwrap.dedent(f"""
        import json, sys
        from pathlib import Path
        from msgen.analysis.plan import Plan
        from msgen.compiler import analyze
        from msgen.emit import emit
        out = {{}}
        for spec, override in {CASES!r}:
            result = analyze(Path(spec), [override] if override else [])
            if result.ok:
                files = emit(Plan(result.spec, result.facts), spec)
                out[f"{{spec}} {{override}}"] = {{f: files[f] for f in ("model.py", "train.py")}}
        out["black imported"] = "black" in sys.modules
        print(json.dumps(out))
        """)
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_compiling_every_spec_never_imports_black(trees):
    assert len(trees) - 1 >= 15  # the cases that compile, and the flag
    assert trees["black imported"] is False


@pytest.mark.parametrize("spec, override", CASES)
def test_generated_python_is_a_fixed_point_of_black(trees, spec, override):
    key = f"{spec} {override}"
    if key not in trees:
        assert override is None, f"{key} does not compile"
        pytest.skip(f"{spec} does not compile (estimate-only)")
    for name, text in trees[key].items():
        assert _black(text) == text, f"{key}: black would change {name}"


@pytest.mark.parametrize(
    "head",
    ["x = f(aaaaaaaaaa)(", "x = y + f(", "return f(", "def f(", "for x in f("],
    ids=["call on a call", "operator", "return", "def", "for over a call"],
)
def test_a_line_of_another_shape_goes_to_black(head):
    source = f"{head}bbbbbbbbbbbbbbbbbbbbbbbbbb, cccccccccccccccccccccccc, dddddddddddddddddddd, eeeeeeee)"
    source += ":\n    pass\n" if head.startswith(("def", "for")) else "\n"
    assert lay_out(source) is None  # black's other rules
    assert format_python(source) == _black(source)


def test_a_call_whose_name_ends_in_a_digit_is_not_a_literal():
    """A call's arguments share a line when they fit; only a literal's get a line each."""
    source = "self.a_rather_long_attribute = Linear2(aaaaaaaaaaaaaaaaaaaa, bbbbbbbbbbbbbbbbbbb, cccccccccccc)\n"
    assert lay_out(source) == _black(source)
    assert len(lay_out(source).splitlines()) == 3


NAMES = st.sampled_from(["x", "self.att", "NO_WEIGHT_DECAY", "step_cell", "first, end"])
ATOMS = st.one_of(
    st.integers(0, 10**6).map(str),
    st.floats(1e-6, 1e4, allow_nan=False).map(repr),
    st.sampled_from(["None", "True", "network", "MICRO_BATCHES", '"decoder.*.ln1.gamma"']),
)


def _tuple(items: list[str]) -> str:
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


VALUES = st.recursive(ATOMS, lambda inner: st.lists(inner, min_size=1, max_size=4).map(_tuple))
ARGS = st.lists(
    st.tuples(st.sampled_from(["", "heads=", "matmul=", "std=", "scores="]), VALUES).map("".join),
    min_size=1,
    max_size=12,
)


ITEMS = st.lists(VALUES, min_size=2, max_size=12).map(", ".join)


@st.composite
def statements(draw) -> str:
    """Statements of the shapes the templates give long lines: a call (keyword
    arguments too), alone or assigned, a list, a `for` over a tuple, a dict entry."""
    shape = draw(st.sampled_from(["call", "assigned call", "list", "for", "dict"]))
    callee = draw(st.sampled_from(["Linear", "Attention", "ops.Add", "Linear2"]))
    if shape == "call":
        return f"{callee}({', '.join(draw(ARGS))})"
    if shape == "assigned call":
        return f"{draw(NAMES)} = {callee}({', '.join(draw(ARGS))})"
    if shape == "list":
        return f"{draw(NAMES)} = [{draw(ITEMS)}]"
    if shape == "for":
        return f"for {draw(NAMES)} in ({draw(ITEMS)}):\n    pass"
    return f'TABLE = {{\n    "{draw(NAMES)}": ({draw(ITEMS)}),\n}}'


@settings(max_examples=400, deadline=None)
@given(statement=statements(), depth=st.integers(0, 3))
def test_splits_equal_blacks(statement, depth):
    """At any depth, what the layout module lays out is what black makes of it."""
    source = "".join(f"{'    ' * i}if c{i}:\n" for i in range(depth))
    source += textwrap.indent(statement, "    " * depth) + "\n"
    laid_out = lay_out(source)
    if laid_out is not None:
        assert laid_out == _black(source)
