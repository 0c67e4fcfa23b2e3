"""moe with a capacity (templates/ops/moe_capacity.py.j2 `MoE.dispatched`), run by MindSpore
on the CPU: stand-alone, its output equals the numpy reference of GShard's capacity
(tests/test_op_moe.py `kept`: Lepikhin et al. 2020, Megatron-LM's
`topk_softmax_with_capacity`) in one group and in two, with tokens dropped, for both
drop policies; and the experts compute their padded slots only, not every token."""

from __future__ import annotations

from math import ceil

import numpy as np
import pytest

from tests import emit_fixtures
from tests.test_generated import randomised
from tests.test_op_moe import kept, moe, route

# 128 tokens, 4 experts, top 2: 0.45 * 128 * 2 / 4 = 28.8 slots per expert in one
# group, 14.4 in each of two (a capacity that is not a whole number of slots)
FACTOR = 0.45
DROPS = {"position": "drop = position, norm_topk = false, ", "probs": "z_loss = 0.001, "}
NAMES = ("router", "gate", "up", "down", "shared_gate", "shared_up", "shared_down")


@pytest.fixture(scope="module", params=sorted(DROPS))
def moe_cell(request, tmp_path_factory):
    drop = request.param
    name = f"tiny_moe_capacity_{drop}_045"
    text = emit_fixtures.SPECS["tiny_moe"].read_text()
    args = f"capacity = {FACTOR}, " + DROPS[drop] + "aux_loss = 0.01"
    path = tmp_path_factory.mktemp(name) / f"{name}.msl"
    path.write_text(text.replace("aux_loss = 0.01", args))
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(emit_fixtures.SPECS, name, path)
        network, rng = randomised(name)
    cell = network.decoder[0].ffn2
    params = {m: getattr(cell, m).asnumpy().astype(np.float64) for m in NAMES if hasattr(cell, m)}
    x = rng.normal(size=(4, 32, 64)).astype(np.float32)
    return cell, drop, params, x


@pytest.mark.parametrize("groups", [1, 2])
def test_capacity_forward_equals_gshards_dispatch(moe_cell, groups):
    import mindspore as ms

    cell, drop, params, x = moe_cell
    cell.groups = groups
    got = cell(ms.Tensor(x))[0].asnumpy()
    norm = drop == "probs"
    want = moe(x.astype(np.float64), params, 4, 2, "swiglu", "softmax", norm, FACTOR, drop, groups)
    _, chosen, weights = route(x.reshape(-1, 64), params["router"], 2, "softmax", norm)
    dropped = int((~kept(chosen, weights, 4, FACTOR, drop, groups)).sum())
    assert dropped >= 10  # 256 copies, at most 4 x 29 kept
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("groups", [1, 2])
def test_the_experts_compute_their_slots_only(moe_cell, groups, monkeypatch):
    """The experts' rows: experts x groups x ceil(0.45 x group tokens x 2 / 4), not the
    4 x 128 of every token."""
    cell, _, _, x = moe_cell
    import mindspore as ms

    cell.groups = groups
    rows = []
    run = cell.run

    def recorded(inputs):
        rows.append(tuple(inputs.shape))
        return run(inputs)

    monkeypatch.setattr(cell, "run", recorded)
    cell(ms.Tensor(x))
    assert rows == [(4, groups * ceil(128 // groups * 2 / 4 * FACTOR), 64)]


def test_the_capacity_paths_strategies_fit_their_inputs(tmp_path, monkeypatch):
    """With ep = 2 inside dp = 4 (tp = 2): every strategy of the dispatch, the experts
    and the combine divides the dims it splits over the stage's 8 devices, and each op
    with a strategy runs (tests/test_api_check.py's checks)."""
    from tests.test_api_check import (
        instantiate,
        stage_devices,
        strategy_problems,
        trace,
        unexercised,
    )

    name = "tiny_moe_capacity_ep2"
    text = emit_fixtures.SPECS["tiny_moe"].read_text()
    text = text.replace("aux_loss = 0.01", f"capacity = {FACTOR}, aux_loss = 0.01")
    text = text.replace("    tp = 2\n}", "    tp = 2\n    ep = 2\n}")
    (tmp_path / f"{name}.msl").write_text(text)
    monkeypatch.setitem(emit_fixtures.SPECS, name, tmp_path / f"{name}.msl")
    network = instantiate(name, lazy=False)
    calls = trace(network, name, shape_only=False)
    assert strategy_problems(calls, stage_devices(name)) == []
    assert unexercised(network, calls) == set()
    ran = {c.path.rsplit(".", 1)[-1] for c in calls if ".ffn2." in c.path}
    assert {"gather", "inner", "outer", "scatter"} <= ran


@pytest.mark.slow
def test_a_capacity_rehearsal_with_ep_trains_as_standalone(tmp_path):
    """`train.py --rehearse` on tiny_moe with capacity 0.45 (its 4 groups of 32 tokens,
    8 slots per expert each: copies are dropped) and ep = 2: the dispatch and combine
    matmuls and the experts' matmuls over ep compile as a rank builds them under
    semi-auto parallel and train step by step as `--standalone` does
    (tests/test_rehearsal.py's oracle), and the loss falls."""
    from tests.emit_fixtures import compile_spec
    from tests.test_rehearsal import STEPS as REHEARSED
    from tests.test_rehearsal import (
        assert_rehearsal_is_standalone,
        losses,
        rehearse_and_standalone,
    )

    text = emit_fixtures.SPECS["tiny_moe"].read_text()
    text = text.replace("aux_loss = 0.01", f"capacity = {FACTOR}, aux_loss = 0.01")
    text = text.replace("    tp = 2\n}", "    tp = 2\n    ep = 2\n}")
    every = f"    seed         = 1234\n    checkpoint = every 1 keep {REHEARSED}"
    text = text.replace("    seed         = 1234", every)
    (tmp_path / "tiny_moe.msl").write_text(text)
    folder = compile_spec(tmp_path / "tiny_moe.msl", tmp_path / "out")
    rehearse_and_standalone(folder)
    assert_rehearsal_is_standalone(folder)
    alone = losses(folder, "standalone")
    assert alone[-1] < alone[0], alone
