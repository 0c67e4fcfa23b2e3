"""`msgen compile SPEC --rehearsal`: what a rank builds is kept, the dims are not.

The rehearsal tree of each big spec must keep the mesh, zero, the loss scale, every op
with its kind, inputs, splits and parameter splits (plan.json's `ops`), and every op's
arguments but its widths (dropout rates, flash, causal, rope, heads, window); only dims, batch and
micro-batch counts shrink, and the model computes in fp32 (the CPU's dtype). The
llama13b rehearsal (tp 8, pp 2, flash attention) is then rehearsed for real.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.emit_fixtures import BIG, SPECS, compile_spec


def ops_of(tree) -> dict:
    doc = json.loads((tree / "plan.json").read_text())
    keep = ("name", "kind", "inputs", "split", "input_splits", "params")
    return {
        layer: [{k: op.get(k) for k in keep} for op in ops] for layer, ops in doc["ops"].items()
    }


def op_args(path, sets=()) -> dict:
    from msgen.compiler import analyze

    spec = analyze(path, list(sets)).spec
    # Widths (a linear's `n`) follow the dims; rates, flags and head counts may not.
    kept = ("heads", "kv_heads", "window")
    return {
        (layer, node.name): {
            k: v
            for k, v in node.args.items()
            if not isinstance(v, int) or isinstance(v, bool) or k in kept
        }
        for layer, graph in spec.layers.items()
        for node in graph.ops
    }


@pytest.fixture(scope="module")
def rehearsals(tmp_path_factory):
    root = tmp_path_factory.mktemp("rehearsal")
    return {
        name: (
            compile_spec(SPECS[name], root / "full" / name),
            compile_spec(SPECS[name], root / "small" / name, "--rehearsal"),
        )
        for name in BIG
    }


@pytest.mark.parametrize("name", BIG)
def test_a_rehearsal_keeps_what_a_rank_builds(rehearsals, name):
    full, small = rehearsals[name]
    big, little = (json.loads((t / "plan.json").read_text()) for t in (full, small))
    assert little["mesh"] == big["mesh"]
    assert little["estimate"]["zero"] == big["estimate"]["zero"]
    assert ops_of(small) == ops_of(full)
    full_train, small_train = ((t / "train.py").read_text() for t in (full, small))
    for constant in ("LOSS_SCALE = ", "ZERO = ", "DP, TP, PP = "):
        lines = [
            [ln for ln in text.splitlines() if ln.startswith(constant)]
            for text in (full_train, small_train)
        ]
        assert lines[0] == lines[1], constant
    assert little["params_total"] * 1000 < big["params_total"]
    assert 1 < little["micro_batches"] <= big["micro_batches"]
    assert little["micro_batches"] >= little["mesh"]["pp"]
    assert set(little["estimate"]["dtypes"].values()) <= {"fp32", None}


def test_the_rehearsal_keeps_every_ops_arguments():
    from msgen.commands.rehearsal import rehearsal_sets

    for name in BIG:
        sets, _ = rehearsal_sets(SPECS[name], [])
        assert op_args(SPECS[name], sets) == op_args(SPECS[name]), name


@pytest.mark.slow
def test_the_llama13b_rehearsal_runs(rehearsals, tmp_path):
    _, small = rehearsals["llama13b"]
    proc = subprocess.run(
        [
            sys.executable,
            "train.py",
            "--rehearse",
            "--synthetic",
            "--steps",
            "2",
            "--output",
            str(tmp_path),
        ],
        cwd=small,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    built = json.loads((tmp_path / "rank_0" / "rehearsal.json").read_text())
    assert built["cells"]["network"] == "Pipeline" and built["cells"]["reducer"] == "GradReducer"
    assert len((tmp_path / "rank_0" / "log.csv").read_text().splitlines()) == 3


def test_fp32_comes_once_the_dims_are_small_when_the_full_dims_do_not_fit_it():
    """specs/validation/mixtral_8x7b.msl at its own layout (dp 8 x pp 4, ep 8) with a
    budget between its bf16 peak and its fp32 peak at full dims (set from the two
    estimates, so that any change to the memory model keeps the case): it fits in
    bf16 and not in fp32; its rehearsal computes in fp32 all the same (the CPU has no
    bf16 MatMul), chosen once the dims are small."""
    from msgen.analysis.plan import Plan
    from msgen.commands.rehearsal import rehearsal_sets
    from msgen.compiler import analyze
    from msgen.estimate.memory import estimate

    spec = SPECS["tiny"].parents[1] / "specs" / "validation" / "mixtral_8x7b.msl"
    fp32 = ["model.dtype=fp32", "model.param_dtype=fp32"]

    def peak(sets):
        result = analyze(spec, sets)
        return estimate(Plan(result.spec, result.facts)).peak.total_bytes

    low, high = peak([]), peak(fp32)
    assert low < high
    mesh = [f"budget.device_memory={(low + high) // 2 // 2**20} MiB"]
    assert analyze(spec, mesh).ok and not analyze(spec, mesh + fp32).ok
    sets, changes = rehearsal_sets(spec, mesh)
    assert set(fp32) <= set(sets) and changes[0].startswith("dtype bf16 → fp32")
    assert analyze(spec, mesh + sets).ok
