"""The dropless moe's permuting dispatcher (templates/ops/moe_permute.py.j2 `MoE.routed`),
run by MindSpore on the CPU in graph mode, against oracles written apart from it: the
token-by-token numpy reference of tests/test_op_moe.py (Megatron-LM's definitions),
numpy's stable argsort for the expert order, and a numpy grouped matmul written from
GroupedMatmul's documented definition (MindSpore 2.10 ops/auto_generate/gen_ops_def.py
`grouped_matmul`: y_i = x_i weight_i over the groups of x's rows that group_list
ends, cumulatively, as its example's [1, 3, 4, 6] over six rows shows)."""

from __future__ import annotations

import inspect
import sys

import numpy as np
import pytest

from tests import test_op_moe
from tests.emit_fixtures import compiled, load

HIDDEN, FFN = 64, 32
STRATEGY = ((1, 1, 1), (1, 1, 1))  # stand-alone: not sharded
MATMUL = ((1, 1), (1, 1))


@pytest.fixture(scope="module")
def model():
    """tiny_moe_dp's model.py (dp = 2 only: data-parallel mode, the permuting path),
    importable by name: graph mode resolves a cell's globals through its module."""
    loaded = load(compiled("tiny_moe_dp"), "model")
    sys.modules[loaded.__name__] = loaded
    yield loaded
    sys.modules.pop(loaded.__name__)


@pytest.fixture
def graph_mode():
    import mindspore as ms

    before = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    yield
    ms.set_context(mode=before)


def cell(model, experts=4, top_k=2, gated=True, sigmoid=False, norm_topk=True, shared=FFN):
    return model.MoE(HIDDEN, experts, top_k, FFN, shared, gated=gated, sigmoid=sigmoid,
                     norm_topk=norm_topk, capacity=None, by_position=False, router=MATMUL,
                     shared_gate=MATMUL, shared_up=MATMUL, shared_down=MATMUL,
                     inner=STRATEGY, outer=STRATEGY)  # fmt: skip


def randomise(moe, rng) -> dict[str, np.ndarray]:
    """Weights of unit-order outputs (the default init's 0.02 would hide errors)."""
    import mindspore as ms

    params = {}
    for p in moe.trainable_params():
        value = rng.normal(0, 0.12, p.shape).astype(np.float32)
        p.set_data(ms.Tensor(value))
        params[p.name.rpartition(".")[2]] = value.astype(np.float64)
    return params


CASES = {
    "swiglu softmax": {},
    "gelu sigmoid unnormalised": {"gated": False, "sigmoid": True, "norm_topk": False},
    "top 1 of 8, no shared": {"experts": 8, "top_k": 1, "shared": 0},
    "top 3 of 4": {"top_k": 3},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_permuting_forward_equals_the_numpy_reference(model, graph_mode, case):
    import mindspore as ms

    kw = CASES[case]
    moe = cell(model, **kw)
    rng = np.random.default_rng(7)
    params = randomise(moe, rng)
    x = rng.normal(0, 1, (2, 32, HIDDEN))
    got = moe(ms.Tensor(x.astype(np.float32))).asnumpy()
    want = test_op_moe.moe(
        x, params, kw.get("experts", 4), kw.get("top_k", 2),
        "swiglu" if kw.get("gated", True) else "gelu",
        "sigmoid" if kw.get("sigmoid") else "softmax", kw.get("norm_topk", True),
    )  # fmt: skip
    assert np.abs(want).max() > 0.5  # outputs of unit order: 1e-5 is a tight bound
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_the_copies_are_sorted_by_expert_stably(model, graph_mode):
    """`sort`: the permute index is numpy's stable argsort of the copies' experts,
    the un-permute index its inverse, and the counts each expert's."""
    import mindspore as ms
    from mindspore import nn

    class Sort(nn.Cell):
        def __init__(self, moe):
            super().__init__()
            self.moe = moe

        def construct(self, copies):
            return self.moe.sort(copies)

    rng = np.random.default_rng(3)
    experts = rng.integers(0, 5, 200)
    experts[experts == 3] = 4  # an expert with no copies
    copies = np.eye(5, dtype=np.float32)[experts]
    row, order, counts = (t.asnumpy() for t in Sort(cell(model, experts=5))(ms.Tensor(copies)))
    np.testing.assert_array_equal(order, np.argsort(experts, kind="stable"))
    np.testing.assert_array_equal(row[order], np.arange(200))
    np.testing.assert_array_equal(counts, np.bincount(experts, minlength=5))


def grouped_matmul(x, weight, group_list):
    """GroupedMatmul with split_item 3, group_type 0, from its docstring: x [M, K]
    split on M at the cumulative ends group_list, y_i = x_i @ weight[i]."""
    starts = np.concatenate([[0], group_list[:-1]])
    return np.concatenate([x[s:e] @ weight[i] for i, (s, e) in enumerate(zip(starts, group_list))])


def test_the_stand_in_is_a_grouped_matmul(model, graph_mode):
    import mindspore as ms
    from mindspore import nn

    class Grouped(nn.Cell):
        def __init__(self, moe):
            super().__init__()
            self.moe = moe

        def construct(self, rows, matrix, ends):
            return self.moe.grouped(rows, matrix, ends)

    rng = np.random.default_rng(5)
    x = rng.normal(0, 1, (23, 6)).astype(np.float32)
    w = rng.normal(0, 1, (5, 6, 3)).astype(np.float32)
    ends = np.array([4, 4, 11, 20, 23], np.int64)  # uneven groups, one empty
    got = Grouped(cell(model))(ms.Tensor(x), ms.Tensor(w), ms.Tensor(ends)).asnumpy()
    np.testing.assert_allclose(got, grouped_matmul(x, w, ends), rtol=1e-5, atol=1e-5)


def test_ascend_builds_groupedmatmul_as_its_210_signature_reads(model, monkeypatch):
    """On Ascend the cell builds GroupedMatmul(split_item=3, group_type=0) and calls it
    with the rows and the matrix as one-tensor lists and group_list eighth, as the
    installed primitive's signature names them (the group_list positional, after the
    five quantisation arguments it leaves None)."""
    import mindspore as ms
    from mindspore.ops.auto_generate import GroupedMatmul

    init = list(inspect.signature(GroupedMatmul.__init__).parameters)
    assert init[:3] == ["self", "split_item", "group_type"]
    call = list(inspect.signature(GroupedMatmul.__call__).parameters)
    assert call == ["self", "x", "weight", "bias", "scale", "offset", "antiquant_scale",
                    "antiquant_offset", "group_list"]  # fmt: skip
    source = inspect.getsource(model.MoE.grouped)
    assert "self.gmm([rows], [matrix], None, None, None, None, None, ends)[0]" in source
    get_context = ms.get_context
    monkeypatch.setattr(
        ms, "get_context", lambda key: "Ascend" if key == "device_target" else get_context(key)
    )
    moe = cell(model)
    assert moe.kernel and isinstance(moe.gmm, GroupedMatmul)
    assert (moe.gmm.split_item, moe.gmm.group_type) == (3, 0)
    assert not cell.__module__ == model.__name__  # the test's helper, not model.py's


def test_the_permuting_gradient_is_the_references(model, graph_mode):
    """The gradient of sum(y * r) for a fixed random r, with respect to each expert
    matrix, the router and x, at random entries: numpy's central differences of the
    reference (the routing does not flip for a step of 1e-4)."""
    import mindspore as ms

    moe = cell(model, shared=0)
    rng = np.random.default_rng(11)
    params = randomise(moe, rng)
    x = rng.normal(0, 1, (1, 8, HIDDEN))
    r = rng.normal(0, 1, x.shape)

    def objective(p, x):
        return float((test_op_moe.moe(x, p, 4, 2) * r).sum())

    def loss(x):
        return (moe(x) * ms.Tensor(r.astype(np.float32))).sum()

    weights = moe.trainable_params()
    grad_x, grads = ms.grad(loss, grad_position=0, weights=weights)(ms.Tensor(x.astype(np.float32)))
    got = {p.name.rpartition(".")[2]: g.asnumpy() for p, g in zip(weights, grads)}
    step = 1e-4
    for name in ("router", "gate", "up", "down", "x"):
        value = x if name == "x" else params[name]
        for _ in range(3):
            at = tuple(rng.integers(0, n) for n in value.shape)
            plus, minus = value.copy(), value.copy()
            plus[at] += step
            minus[at] -= step
            if name == "x":
                numeric = (objective(params, plus) - objective(params, minus)) / (2 * step)
                analytic = grad_x.asnumpy()[at]
            else:
                numeric = (
                    objective(params | {name: plus}, x) - objective(params | {name: minus}, x)
                ) / (2 * step)
                analytic = got[name][at]
            assert abs(analytic - numeric) <= 1e-3 * max(1.0, abs(numeric)), (name, at)


def chunks(rows: np.ndarray, counts) -> list[np.ndarray]:
    return np.split(rows, np.cumsum(counts)[:-1])


def test_two_expert_parallel_ranks_compute_the_reference(model):
    """ep = 2 run by hand: two ranks, each with its own 16 tokens and experts / ep = 2
    of the 4 experts (rank d the experts 2d, 2d + 1), call the dispatcher's parts as
    `routed` does, the AlltoAllVs between them done in numpy from AlltoAllV's
    definition (rank r sends its send[d] rows in order to rank d, which concatenates
    what it receives by source rank; MindSpore 2.10 ops/operations/comm_ops.py). The
    two ranks' outputs are the numpy reference's over all 32 tokens."""
    import mindspore as ms

    moe = cell(model, shared=0)
    rng = np.random.default_rng(13)
    params = randomise(moe, rng)
    x = rng.normal(0, 1, (2, 16, HIDDEN))
    ep, local = 2, 2
    left = []
    for r in range(ep):
        weights, chosen, _ = moe.route(ms.Tensor(x[r].astype(np.float32)))
        rows, ids, row, per_rank = moe.leave(ms.Tensor(x[r].astype(np.float32)), chosen, local)
        send = per_rank.asnumpy().sum(1)
        left.append((weights, row, send, chunks(rows.asnumpy(), send), chunks(ids.asnumpy(), send)))
    outs = []
    for d in range(ep):
        rows = np.concatenate([left[r][3][d] for r in range(ep)])
        ids = np.concatenate([left[r][4][d] for r in range(ep)])
        mats = {m: ms.Tensor(params[m][d * local : (d + 1) * local].astype(np.float32))
                for m in ("gate", "up", "down")}  # fmt: skip
        moe.ep_index = d
        out = moe.compute(ms.Tensor(rows.astype(np.float32)), ms.Tensor(ids), **mats)
        outs.append(chunks(out.asnumpy(), [left[r][2][d] for r in range(ep)]))
    moe.ep_index = 0
    got = []
    for r in range(ep):
        weights, row = left[r][0], left[r][1]
        back = np.concatenate([outs[d][r] for d in range(ep)])
        got.append(moe.combine(ms.Tensor(back), row, weights).asnumpy())
    assert all(len(left[r][3][d]) for r in range(ep) for d in range(ep))  # both ways
    want = test_op_moe.moe(x, {m: params[m] for m in ("router", "gate", "up", "down")}, 4, 2)
    np.testing.assert_allclose(np.stack(got), want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("ep, edp, tp, stages", [(2, 2, 2, 1), (4, 1, 2, 2), (2, 3, 1, 3)])
def test_each_rank_exchanges_with_the_ranks_holding_the_other_experts(model, ep, edp, tp, stages):
    """`expert_ranks`: the devices laid out in Megatron-LM's order (megatron/core/
    parallel_state.py: tp innermost, then ep, then the expert data-parallel dim, the
    stage outermost), numpy's row-major [stages, dp / ep, ep, tp] (MindSpore's Layout:
    the last device dim varies fastest); a rank's group is its column along ep, and
    its index its ep coordinate."""
    grid = np.arange(stages * edp * ep * tp).reshape(stages, edp, ep, tp)
    for rank in range(grid.size):
        s, e, i, t = (int(c[0]) for c in np.nonzero(grid == rank))
        assert model.expert_ranks(rank, (edp, ep, tp)) == (grid[s, e, :, t].tolist(), i)
