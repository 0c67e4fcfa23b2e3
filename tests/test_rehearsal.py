"""`train.py --rehearse`: what a rank builds, run on one CPU process, trains as `--standalone`.

The rehearsal builds the gradient reducer, the micro-batch wrapper, the loss-scale and
overflow logic and the checkpoint filter a rank builds, and stands in for where
semi-auto parallel leaves each gradient (RehearsedMirror: returned by the parameter's
mirror, or in `accu_grads`, as train.py's GRADIENT_FROM says). Stand-alone runs the
logical model with none of that, so the two agreeing step by step (loss and every
weight and moment after each step) is the oracle: a reducer that takes a gradient from
the wrong place trains on constant gradients and parts from it at the first step.
Whether MindSpore inserts a mirror the rehearsal cannot tell (its stand-in follows
GRADIENT_FROM); the hand table below and tests/test_gradient_source.py's hold it.

The trees cover zero in {0, 1, 2} x pp in {1, 2} x micro_batches in {1, > 1} x loss
scale dynamic / fixed / none pairwise (every feasible pair of two factors' values in
some tree; pp = 2 needs micro_batches >= 2), which test_the_cover_is_pairwise checks.
The zero = 0, pp = 2 case (MindSpore's own PipelineGradReducer fails to compile there)
and the zero = 0, pp = 1 gradient-accumulation case run by default, the rest under
`slow`.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path

import numpy as np
import pytest

from tests.emit_fixtures import compile_spec

STEPS = 3

SPEC = """msl 0.1

model rehearsed {{
    vocab  = 64
    hidden = 32
    heads  = 2
    ffn    = 2 * hidden
    layers = 2
    seq    = 16
    dtype  = fp32
}}

cluster {{
    device   = ascend910b
    per_node = {devices}
    nodes    = ["127.0.0.1"]
}}

mesh {{
    dp = 1
    tp = 2
    pp = {pp}
}}

layer decoder {{
    input x : [batch, seq, hidden] @ [dp, 1, 1]
    ln1  = layernorm(x)
    qkv  = linear(ln1, 3 * hidden) weight @ [1, tp]
    att  = attention(qkv, heads = heads, causal = true) @ [dp, 1, tp]
    proj = linear(att, hidden) weight @ [tp, 1]
    h    = x + proj
    ln2  = layernorm(h)
    up   = linear(ln2, ffn) weight @ [1, tp]
    act  = gelu(up)
    down = linear(act, hidden) weight @ [tp, 1]
    output h + down
}}

network {{
    input tokens : [batch, seq] @ [dp, 1]
    emb    = embedding(tokens, vocab, hidden) table @ [tp, 1]
    pos    = positions(seq, hidden)
    x      = emb + pos
    body   = repeat decoder(x) layers
    norm   = layernorm(body)
    logits = linear(norm, vocab, tie = emb)
    output cross_entropy(logits, tokens)
}}

pipeline {{
    micro_batches = {micro_batches}
}}

train {{
    micro_batch  = 2
    global_batch = {global_batch}
    optimizer    = adamw(lr = 1e-2, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1)
    schedule     = cosine(warmup = 1, steps = 10, min_lr = 1e-3)
    zero         = {zero}
    loss_scale   = {loss_scale}
    grad_clip    = 1.0
    checkpoint   = every 1 keep {steps}
    seed         = 7
}}
"""

# (zero, pp, micro_batches, loss_scale)
CASES = {
    "z0_pp1_mb1_none": (0, 1, 1, "none"),
    "z0_pp1_mb2_dynamic": (0, 1, 2, "dynamic"),
    "z0_pp2_mb2_fixed": (0, 2, 2, "1024"),
    "z1_pp1_mb1_dynamic": (1, 1, 1, "dynamic"),
    "z1_pp1_mb2_fixed": (1, 1, 2, "0.5"),
    "z1_pp2_mb4_none": (1, 2, 4, "none"),
    "z2_pp1_mb1_fixed": (2, 1, 1, "0.5"),
    "z2_pp1_mb2_none": (2, 1, 2, "none"),
    "z2_pp2_mb2_dynamic": (2, 2, 2, "dynamic"),
}
FAST = {"z0_pp2_mb2_fixed"}

# Where the reducer reads each parameter's gradient, from MindSpore 2.10's source
# (written here, not read from train.py): GradAccumulation (pp = 1) and Pipeline both
# make the pass insert micro-step mirrors (CreateMirrorOps), and only for a parameter
# that another device of its stage also holds (InferMirrorOps); the mirror returns the
# reduced gradient only with the parallel optimizer on and otherwise 1.0, having
# written it to `accu_grads` (grad_comm_ops.py, get_bprop_mirror_micro_step_operator,
# `opt_shard`), and a parameter without a mirror keeps it in `accu_grads` and receives
# 0 (get_bprop_virtual_assign_add). The mesh is dp 1 x tp 2, so a stage has 2 devices:
# split over tp (the embedding table [tp, 1], qkv and up weights and biases, proj and
# down weights), a parameter has no copy on the other device and no mirror; whole
# (positions, norms, the row-parallel biases), it has one.
SPLIT_OVER_THE_STAGE = (
    "emb.table",
    "decoder.*.qkv.weight",
    "decoder.*.qkv.bias",
    "decoder.*.proj.weight",
    "decoder.*.up.weight",
    "decoder.*.up.bias",
    "decoder.*.down.weight",
)


def gradient_from(name: str, zero: int) -> str:
    split = any(fnmatch(name, pattern) for pattern in SPLIT_OVER_THE_STAGE)
    return "mirror" if zero > 0 and not split else "accu_grads"


def levels(case: tuple) -> tuple:
    """A tree's value of each factor: zero, pp, micro_batches 1 or > 1, loss scale kind."""
    zero, pp, micro_batches, loss_scale = case
    kind = loss_scale if loss_scale in ("none", "dynamic") else "fixed"
    return zero, pp, "1" if micro_batches == 1 else ">1", kind


def test_the_cover_is_pairwise():
    factors = [(0, 1, 2), (1, 2), ("1", ">1"), ("dynamic", "fixed", "none")]
    trees = [levels(case) for case in CASES.values()]
    missing = []
    for i, j in itertools.combinations(range(len(factors)), 2):
        for a, b in itertools.product(factors[i], factors[j]):
            if {i: a, j: b}.get(1) == 2 and {i: a, j: b}.get(2) == "1":
                continue  # a pipeline of 2 stages needs 2 micro-batches or more
            if not any(tree[i] == a and tree[j] == b for tree in trees):
                missing.append((i, a, j, b))
    assert not missing, f"pairs no tree covers (factor, value, factor, value): {missing}"


def write_spec(folder: Path, zero: int, pp: int, micro_batches: int, loss_scale: str) -> Path:
    spec = folder / "rehearsed.msl"
    spec.write_text(
        SPEC.format(
            devices=2 * pp,
            pp=pp,
            micro_batches=micro_batches,
            global_batch=2 * micro_batches,
            zero=zero,
            loss_scale=loss_scale,
            steps=STEPS,
        )
    )
    return spec


def run(folder: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "GLOG_v": "3"}
    return subprocess.Popen(
        [sys.executable, "train.py", *args],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def rehearse_and_standalone(folder: Path) -> dict[str, str]:
    """Both runs side by side, STEPS steps each, into output_rehearse/ and output_standalone/;
    what each printed."""
    procs = {
        mode: run(
            folder, f"--{mode}", "--synthetic", "--steps", str(STEPS), "--output", f"output_{mode}"
        )
        for mode in ("rehearse", "standalone")
    }
    printed = {}
    for mode, proc in procs.items():
        out, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, f"--{mode} failed:\n{out[-4000:]}"
        printed[mode] = out
    return printed


def losses(folder: Path, mode: str) -> list[float]:
    with (folder / f"output_{mode}" / "rank_0" / "log.csv").open() as f:
        return [float(row["loss"]) for row in csv.DictReader(f)]


def checkpoint(folder: Path, mode: str, step: int) -> dict[str, np.ndarray]:
    import mindspore as ms

    path = folder / f"output_{mode}" / "rank_0" / f"step_{step:08d}.ckpt"
    return {name: p.asnumpy() for name, p in ms.load_checkpoint(str(path)).items()}


def assert_rehearsal_is_standalone(folder: Path) -> None:
    rehearsed, alone = losses(folder, "rehearse"), losses(folder, "standalone")
    assert len(rehearsed) == len(alone) == STEPS
    for step, (a, b) in enumerate(zip(rehearsed, alone), 1):
        # log.csv keeps 6 significant digits
        assert math.isclose(a, b, rel_tol=1e-5), f"step {step}: loss {a} rehearsed, {b} alone"
    for step in range(1, STEPS + 1):
        ours, theirs = checkpoint(folder, "rehearse", step), checkpoint(folder, "standalone", step)
        assert ours.keys() == theirs.keys()
        for name, value in theirs.items():
            np.testing.assert_allclose(
                ours[name], value, rtol=0, atol=1e-5, err_msg=f"step {step}: {name}"
            )


def rehearsal_json(folder: Path) -> dict:
    return json.loads((folder / "output_rehearse" / "rank_0" / "rehearsal.json").read_text())


@pytest.mark.parametrize(
    "case",
    [pytest.param(name, marks=() if name in FAST else pytest.mark.slow) for name in CASES],
)
def test_a_rehearsal_trains_as_standalone(case, tmp_path):
    zero, pp, micro_batches, loss_scale = CASES[case]
    folder = compile_spec(
        write_spec(tmp_path, zero, pp, micro_batches, loss_scale), tmp_path / "out"
    )
    printed = rehearse_and_standalone(folder)
    # One process, one rank folder: the first line says so, not the cluster's world size.
    assert (
        f"; world size 1 (--rehearse: the dp 1 x tp 2 x pp {pp} mesh in one process); "
        f"writing {folder / 'output_rehearse' / 'rank_0'}" in printed["rehearse"].splitlines()[0]
    )
    assert_rehearsal_is_standalone(folder)
    built = rehearsal_json(folder)
    accumulates = pp > 1 or micro_batches > 1
    wrapper = "Pipeline" if pp > 1 else "GradAccumulation"
    expected = {"step": "TrainStep", "network": wrapper, "optimizer": "AdamW"}
    if accumulates:
        expected |= {"reducer": "GradReducer", "mirror": "RehearsedMirror"}
    if loss_scale == "dynamic":
        expected["scaler"] = "DynamicLossScaler"
    assert built["cells"] == expected
    params = built["parameters"]
    moments = {n.removeprefix("adam_m."): s for n, s in params.items() if n.startswith("adam_m.")}
    buffers = {
        n.removeprefix("accu_grads."): s for n, s in params.items() if n.startswith("accu_grads.")
    }
    # One accumulation buffer per trained weight, of its shape, only when the step accumulates.
    assert moments and buffers == (moments if accumulates else {})
    if accumulates:
        assert built["gradient_from"] == {name: gradient_from(name, zero) for name in moments}
    else:
        assert "gradient_from" not in built


def test_rehearse_excludes_standalone(tmp_path):
    folder = compile_spec(write_spec(tmp_path, *CASES["z0_pp2_mb2_fixed"]), tmp_path / "out")
    proc = run(folder, "--rehearse", "--standalone", "--synthetic")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2
    assert "--rehearse and --standalone exclude each other" in out.splitlines()[-1]
    assert "Traceback" not in out


def test_a_data_parallel_mesh_has_nothing_to_rehearse():
    from tests.emit_fixtures import compiled

    proc = run(compiled("tiny_dp"), "--rehearse", "--synthetic")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 2
    assert "nothing beyond --standalone and msrun" in out.splitlines()[-1]
