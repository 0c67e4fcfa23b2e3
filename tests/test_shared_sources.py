"""Module-level source two helper fragments carry is defined once in model.py: a model
with a yarn-scaled `attention` and a yarn-scaled `mla` gets the rope frequency
functions (msgen/ops/rope_scaling/frequencies.py) once, not twice (ruff's F811)."""

from __future__ import annotations

import ast
import collections
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from msgen.analysis.plan import build_plan
from msgen.compiler import analyze_text
from msgen.emit import emit

SPECS = Path(__file__).resolve().parent / "specs"
YARN = "yarn(factor = 4, original_max_position_embeddings = 8)"
# tiny_mla's decoder with an attention branch after its mla one
BRANCH = f"""    h    = x + o
    qkv  = linear(h, 3 * hidden, bias = false) weight @ [1, tp]
    att2 = attention(qkv, heads = heads, causal = true, rope = true,
                     rope_scaling = {YARN}) @ [dp, 1, tp]
    o2   = linear(att2, hidden, bias = false) weight @ [tp, 1]
    h2   = h + o2
    n2   = rmsnorm(h2)"""


@pytest.fixture(scope="module")
def model_py() -> str:
    text = (SPECS / "tiny_mla.msl").read_text()
    text = text.replace("    h    = x + o\n    n2   = rmsnorm(h)", BRANCH)
    text = text.replace("output h + down", "output h2 + down")
    result = analyze_text(text, "both.msl", SPECS)
    assert result.ok, [d.message for d in result.diagnostics]
    return emit(build_plan(result.spec, result.facts), "both.msl")["model.py"]


def test_both_scaled_ropes_share_one_definition_of_the_frequencies(model_py):
    tree = ast.parse(model_py)
    names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)]
    twice = [name for name, n in collections.Counter(names).items() if n > 1]
    assert twice == []
    assert "rope_frequencies" in names
    assert "Attention(" in model_py and "MLA(" in model_py


@pytest.mark.skipif(
    shutil.which("ruff") is None and not (Path(sys.executable).parent / "ruff").exists(),
    reason="no ruff",
)
def test_ruff_finds_no_redefinition(model_py, tmp_path):
    path = tmp_path / "model.py"
    path.write_text(model_py)
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    run = subprocess.run(
        [ruff, "check", "--isolated", "--select", "F", str(path)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout
