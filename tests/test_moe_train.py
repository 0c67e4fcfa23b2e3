"""tests/specs/tiny_moe.msl trained by its generated train.py on the CPU, and
tests/specs/tiny_moe_dp.msl under msrun as two data-parallel processes (dp = 2, ep = 1:
the CPU build has no AllToAll) beside a stand-alone run of the same global batches, as
tests/test_multirank.py trains the dense tiny_dp (and a copy with auxiliary losses
under msrun); and `train.py --rehearse` with ep = 2. The auxiliary losses are part of
the loss the step differentiates: the network's gradient with respect to the router
is the numpy reference's (tests/test_op_moe.py, aux and z-loss included) by central
differences."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from tests import emit_fixtures
from tests import reference_numpy as ref
from tests.emit_fixtures import SPECS, compile_spec, plan
from tests.test_moe_aux_log import LOGGED, micro_batch_losses
from tests.test_multirank import checkpoint, finish, log_rows, msrun, standalone
from tests.test_rehearsal import STEPS as REHEARSED
from tests.test_rehearsal import (
    assert_rehearsal_is_standalone,
    rehearsal_json,
    rehearse_and_standalone,
)
from tests.test_rehearsal import run as run_train

STEPS, DP_STEPS = 30, 4
COEFF, LAYERS = 0.01, 2  # tiny_moe's aux_loss and layers


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = emit_fixtures.copy_compiled("tiny_moe", tmp_path_factory.mktemp("moe") / "tiny")
    finish(standalone(folder, "output", "--synthetic", "--steps", str(STEPS)), folder)
    return log_rows(folder / "output" / "rank_0" / "log.csv")


@pytest.mark.slow
def test_tiny_moe_trains_and_logs_its_auxiliary_loss(trained):
    """The loss starts near uniform over the 256 tokens plus the two layers' Switch
    losses (about the coefficient each, for a router near uniform: E * sum_e P_e f_e
    = 1 when every expert gets 1/E), and falls; aux_loss is logged every step."""
    losses = [float(r["loss"]) for r in trained]
    aux = [float(r["aux_loss"]) for r in trained]
    assert [int(r["step"]) for r in trained] == list(range(1, STEPS + 1))
    assert abs(losses[0] - (math.log(256) + LAYERS * COEFF)) < 0.1
    assert np.mean(losses[-3:]) < 0.7 * losses[0], losses
    assert all(0.9 * LAYERS * COEFF < a < 2 * LAYERS * COEFF for a in aux), aux


AUX = "aux_loss = 0.01, z_loss = 0.001"


@pytest.fixture(scope="module")
def dp_runs(tmp_path_factory):
    """tiny_moe_dp under msrun and stand-alone; in its folder `aux`, the spec with
    auxiliary losses under msrun."""
    root = tmp_path_factory.mktemp("moe_dp")
    folder = compile_spec(SPECS["tiny_moe_dp"], root / "out")
    text = (
        SPECS["tiny_moe_dp"].read_text().replace("shared_ffn = ffn)", f"shared_ffn = ffn, {AUX})")
    )
    every = f"    seed         = 1234\n    checkpoint = every 1 keep {DP_STEPS}"
    text = text.replace("    seed         = 1234", every)
    (root / "aux.msl").write_text(text)
    aux = compile_spec(root / "aux.msl", root / "aux")
    model = (aux / "model.py").read_text()
    assert "aux_loss=0.01," in model and "z_loss=0.001" in model
    cwd = folder / "msrun_cwd"
    cwd.mkdir()
    steps = ("--synthetic", "--steps", str(DP_STEPS))
    started = [
        (standalone(folder, "alone", *steps), folder),
        (msrun(folder, cwd, folder / "msrun", *steps), cwd),
        (msrun(aux, aux, aux / "msrun", *steps), aux),
    ]
    for proc, where in started:
        finish(proc, where)
    return folder, aux


@pytest.mark.slow
def test_two_data_parallel_ranks_train_as_the_standalone_run(dp_runs):
    """Both ranks end with the same weights, the stand-alone run's within 1e-4, as are
    the losses and gradient norms each rank logs."""
    folder, _ = dp_runs
    ranks = [checkpoint(folder / "msrun" / f"rank_{r}" / f"step_{DP_STEPS:08d}.ckpt") for r in (0, 1)]  # fmt: skip
    alone = checkpoint(folder / "alone" / "rank_0" / f"step_{DP_STEPS:08d}.ckpt")
    assert set(ranks[0]) == set(ranks[1]) == set(alone)
    assert any(".ffn2.gate" in name for name in alone)
    for name in ranks[0]:
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name], err_msg=name)
        np.testing.assert_allclose(ranks[0][name], alone[name], atol=1e-4, err_msg=name)
    alone_log = log_rows(folder / "alone" / "rank_0" / "log.csv")
    for rank in (0, 1):
        log = log_rows(folder / "msrun" / f"rank_{rank}" / "log.csv")
        assert [int(r["step"]) for r in log] == list(range(1, DP_STEPS + 1))
        for mine, theirs in zip(log, alone_log, strict=True):
            for key in ("loss", "grad_norm"):
                assert float(mine[key]) == pytest.approx(float(theirs[key]), abs=1e-4), key
    assert float(alone_log[-1]["loss"]) < float(alone_log[0]["loss"])


@pytest.mark.slow
def test_with_auxiliary_losses_the_ranks_stay_one_replica(dp_runs):
    """With auxiliary losses each rank computes its own tokens', and the gradient
    reduction still leaves both ranks with the same weights, moved. Both log as
    aux_loss the replicas' mean of their micro-batches' mean, as the loss, which
    Megatron-LM's reduce_aux_losses_tracker_across_ranks averages over dp too: the
    numpy reference on each rank's micro-batches (tests/test_moe_aux_log.py) from the
    weights each step started from; the ranks' own means differ from it."""
    _, aux = dp_runs
    ranks = [checkpoint(aux / "msrun" / f"rank_{r}" / f"step_{DP_STEPS:08d}.ckpt") for r in (0, 1)]  # fmt: skip
    for name in ranks[0]:
        if name != "add_aux.total":  # each rank's own sum
            np.testing.assert_array_equal(ranks[0][name], ranks[1][name], err_msg=name)
    logs = [log_rows(aux / "msrun" / f"rank_{r}" / "log.csv") for r in (0, 1)]
    for mine, theirs in zip(*logs, strict=True):
        assert float(mine["loss"]) == float(theirs["loss"])  # the replicas' mean
        assert mine["aux_loss"] == theirs["aux_loss"]
    train, spec_plan = emit_fixtures.load(aux, "train"), plan_of((aux.parent.parent / "aux.msl").read_text())  # fmt: skip
    for step in range(2, DP_STEPS + 1):
        params = checkpoint(aux / "msrun" / "rank_0" / f"step_{step - 1:08d}.ckpt")
        own = []
        for rank in (0, 1):
            tokens, labels = next(train.synthetic_batches(2, rank, step - 1))
            sums = micro_batch_losses(spec_plan, params, tokens, labels, train.MICRO_BATCHES)
            own.append(float(np.mean(sums)))
        expected = float(np.mean(own))
        assert abs(own[0] - own[1]) > 20 * LOGGED * expected, own  # the mean is not a rank's
        logged = float(logs[0][step - 1]["aux_loss"])
        assert abs(logged - expected) <= LOGGED * expected, (step, logged, own)


def test_the_router_gradient_includes_the_auxiliary_losses():
    """d loss / d router of the MindSpore network (PyNative, fp32) along a random
    direction equals the numpy reference's central difference (float64), the
    auxiliary losses included; without them the two would differ."""
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE)
    from tests.test_generated import batch, randomised

    network, rng = randomised("tiny_moe")
    tokens, labels = batch("tiny_moe", rng, rows=2)
    params = {p.name: p.asnumpy().astype(np.float64) for p in network.get_parameters()}
    router = "decoder.1.ffn2.router"
    (weight,) = [p for p in network.trainable_params() if p.name == router]
    grad_fn = ms.value_and_grad(network, grad_position=None, weights=[weight])
    _, (grad,) = grad_fn(ms.Tensor(tokens), ms.Tensor(labels))
    direction = rng.normal(size=params[router].shape)
    eps = 1e-6  # small enough that no token changes its experts

    def loss_at(t: float, spec_plan) -> float:
        moved = dict(params, **{router: params[router] + t * direction})
        return ref.forward_loss(spec_plan, moved, tokens, labels)

    with_aux = plan("tiny_moe")
    numeric = (loss_at(eps, with_aux) - loss_at(-eps, with_aux)) / (2 * eps)
    analytic = float((grad.asnumpy().astype(np.float64) * direction).sum())
    assert analytic == pytest.approx(numeric, rel=1e-5), abs(analytic - numeric)
    # The auxiliary losses' share of that derivative is far above the tolerance.
    without = plan_of(SPECS["tiny_moe"].read_text().replace("aux_loss = 0.01", "aux_loss = 0"))
    share = numeric - (loss_at(eps, without) - loss_at(-eps, without)) / (2 * eps)
    assert abs(share) > 100 * 1e-5 * abs(numeric), (share, numeric)


def plan_of(text: str):
    from msgen.analysis.plan import build_plan
    from msgen.compiler import analyze_text

    result = analyze_text(text, "spec.msl", SPECS["tiny_moe"].parent)
    assert result.ok, [d.message for d in result.diagnostics]
    return build_plan(result.spec, result.facts)


@pytest.mark.slow
@pytest.mark.parametrize("pp", [1, 2])
def test_a_rehearsal_with_ep_trains_as_standalone(tmp_path, pp):
    """`train.py --rehearse` on tiny_moe with ep = 2 and zero = 1 (the experts' states
    sliced over dp / ep), and with pp = 2 on two servers (the auxiliary losses' sum
    passed from stage to stage, added on the last): what a rank builds (the reducer,
    the micro-step mirror over the experts' accumulation buffers) on one CPU process
    trains step by step as `--standalone` does (tests/test_rehearsal.py's oracle), and
    the rehearsal's record holds the experts whole, each with its moments and buffer,
    and logs the stand-alone run's aux_loss (with pp = 2 too: the last stage holds the
    sum over every stage's layers)."""

    text = SPECS["tiny_moe"].read_text()
    text = text.replace("    tp = 2\n}", f"    tp = 2\n    pp = {pp}\n    ep = 2\n}}")
    nodes = ", ".join(f'"127.0.0.{i}"' for i in range(1, pp + 1))
    text = text.replace('nodes    = ["127.0.0.1"]', f"nodes    = [{nodes}]")
    text = text.replace(
        "    seed         = 1234",
        f"    seed         = 1234\n    zero = 1\n    checkpoint = every 1 keep {REHEARSED}",
    )
    (tmp_path / "tiny_moe.msl").write_text(text)
    folder = compile_spec(tmp_path / "tiny_moe.msl", tmp_path / "out")
    assert "ep 2" in (folder / "plan.json").read_text().replace('"ep": ', "ep ")
    rehearse_and_standalone(folder)
    assert_rehearsal_is_standalone(folder)
    params = rehearsal_json(folder)["parameters"]
    for prefix in ("", "adam_m.", "adam_v.", "accu_grads."):
        assert params[f"{prefix}decoder.1.ffn2.gate"] == [4, 64, 32]
        assert params[f"{prefix}decoder.1.ffn2.down"] == [4, 32, 64]
    aux = {
        mode: [float(r["aux_loss"]) for r in log_rows(folder / f"output_{mode}" / "rank_0" / "log.csv")]  # fmt: skip
        for mode in ("rehearse", "standalone")
    }
    assert all(a > 0 for a in aux["rehearse"])
    assert aux["rehearse"] == pytest.approx(aux["standalone"], rel=LOGGED)


@pytest.mark.slow
def test_mixtral_rehearses_at_rehearsal_size(tmp_path):
    """specs/validation/mixtral_8x7b.msl compiled with --rehearsal (dp 8 x pp 4, ep 8
    inside dp, at the smallest dims it checks with) runs two steps of `train.py
    --rehearse` on one CPU process through the dropless Morph region, its loss near
    uniform over its rehearsal vocabulary. Its aux_loss column, logged with pp > 1 on
    the last stage, is Switch's loss of each moe layer, which is at least its
    coefficient (0.02) and equals it when the routing is balanced, as it nearly is
    from random weights: 0.02 per layer of plan.json's count, within 10%."""
    folder = compile_spec(
        emit_fixtures.ROOT / "specs" / "validation" / "mixtral_8x7b.msl", tmp_path, "--rehearsal"
    )
    proc = run_train(folder, "--rehearse", "--synthetic", "--steps", "2")
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, out[-3000:]
    rows = log_rows(folder / "output" / "rank_0" / "log.csv")
    assert [int(r["step"]) for r in rows] == [1, 2]
    (vocab,) = (line for line in (folder / "train.py").read_text().splitlines()
                if line.startswith("VOCAB = "))  # fmt: skip
    uniform = math.log(int(vocab.removeprefix("VOCAB = ")))
    assert all(abs(float(r["loss"]) - uniform) < 0.5 for r in rows), (uniform, rows)
    layers = json.loads((folder / "plan.json").read_text())["layers"]["decoder"]["count"]
    assert all(0.02 * layers <= float(r["aux_loss"]) < 0.022 * layers for r in rows), rows
