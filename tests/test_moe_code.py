"""The moe op's generated code (templates/ops/moe.py.j2) run by MindSpore on the CPU
against its numpy reference (tests/test_op_moe.py), op by op as tests/test_ops.py runs
the tiny specs' ops: tests/specs/tiny_moe.msl (swiglu, softmax, dropless, a shared
expert, q/k norms), and the same spec with the other choices (gelu, sigmoid, no
renormalisation, a capacity dropping by probability or by position, a z-loss): its
output and its auxiliary losses. Then the whole
tiny_moe network the way tests/test_generated.py, test_api_check.py and test_ops.py
check the other tiny specs (tiny_moe is not among emit_fixtures.TINY, whose specs
every training test also trains: its own training runs are in test_moe_train.py)."""

from __future__ import annotations

import pytest

from tests import emit_fixtures, test_op_moe
from tests import reference_numpy as ref
from tests.emit_fixtures import plan
from tests.test_api_check import instantiate, stage_devices, strategy_problems, trace, unexercised
from tests.test_generated import batch, check_against_plan, mindspore_loss, randomised
from tests.test_generated import build as build_network
from tests.test_op_loss import test_loss_and_gradient_equal_numpy as loss_equals_numpy
from tests.test_ops import test_each_op_computes_its_reference as computes_its_reference
from tests.test_ops import test_each_op_imports_what_its_code_uses as imports_what_it_uses

VARIANTS = {
    "tiny_moe": "",
    "tiny_moe_gelu_sigmoid": "activation = gelu, router = sigmoid, norm_topk = false, ",
    "tiny_moe_capacity_probs": "capacity = 0.5, z_loss = 0.001, ",
    "tiny_moe_capacity_position": "capacity = 0.5, drop = position, norm_topk = false, ",
}


@pytest.fixture(params=sorted(VARIANTS))
def variant(request, tmp_path, monkeypatch):
    name = request.param
    if VARIANTS[name]:
        text = emit_fixtures.SPECS["tiny_moe"].read_text()
        path = tmp_path / f"{name}.msl"
        path.write_text(text.replace("aux_loss = 0.01", VARIANTS[name] + "aux_loss = 0.01"))
        monkeypatch.setitem(emit_fixtures.SPECS, name, path)
    return name


def test_moe_code_computes_its_reference(variant):
    computes_its_reference(variant)


def test_moe_code_imports_what_it_uses():
    imports_what_it_uses("tiny_moe")


class Trained:
    """The network as the plan sees it: its parameters but `add_aux.total` (the
    auxiliary losses summed over a step's micro-batches for the log, not a weight)."""

    def __init__(self, network):
        self.network = network

    def get_parameters(self):
        return (p for p in self.network.get_parameters() if p.name != "add_aux.total")

    def cells_and_names(self):
        return self.network.cells_and_names()


def test_parameters_are_the_plan_params():
    network = build_network("tiny_moe")
    check_against_plan(Trained(network), emit_fixtures.plan_json("tiny_moe"))
    records = [p for p in network.get_parameters() if not p.requires_grad]
    assert [p.name for p in records] == ["add_aux.total"]
    assert not set(records) & set(network.trainable_params())


def test_loss_cell_equals_numpy():
    loss_equals_numpy("tiny_moe")


def test_strategies_fit_the_inputs_and_the_shape_only_trace_agrees():
    network = instantiate("tiny_moe", lazy=False)
    real = trace(network, "tiny_moe", shape_only=False)
    assert real and strategy_problems(real, stage_devices("tiny_moe")) == []
    assert unexercised(network, real) == set()
    shaped = trace(instantiate("tiny_moe", lazy=True), "tiny_moe", shape_only=True)
    assert [(c.path, c.shapes) for c in shaped] == [(c.path, c.shapes) for c in real]


@pytest.fixture(scope="module")
def forward():
    network, rng = randomised("tiny_moe")
    tokens, labels = batch("tiny_moe", rng, rows=2)
    params = {p.name: p.asnumpy() for p in network.get_parameters()}
    return mindspore_loss(network, tokens, labels), params, tokens, labels


def tolerance(expected: float) -> float:
    return 1e-4 * max(1.0, abs(expected))


def test_forward_matches_the_numpy_reference(forward):
    loss, params, tokens, labels = forward
    expected = ref.forward_loss(plan("tiny_moe"), params, tokens, labels)
    assert abs(loss - expected) <= tolerance(expected), (loss, expected)


@pytest.mark.parametrize("change", ["top_k", "norm_topk", "no_shared"])
def test_the_reference_comparison_sees_the_routing(forward, monkeypatch, change):
    """Not vacuous: the reference routing each token to one expert instead of two,
    leaving the top-k weights unnormalised, or without the shared expert is several
    times the comparison's tolerance away from MindSpore's loss (the changes move the
    loss by 3e-3 to 4e-2; the tolerance is 7e-4)."""
    loss, params, tokens, labels = forward
    moe = test_op_moe.moe

    def altered(x, p, experts, top_k, *args, **kwargs):
        if change == "top_k":
            top_k = 1
        elif change == "norm_topk":
            args = args[:2] + (False,) + args[3:]
        else:
            p = {k: v for k, v in p.items() if not k.startswith("shared_")}
        return moe(x, p, experts, top_k, *args, **kwargs)

    monkeypatch.setattr(test_op_moe, "moe", altered)
    expected = ref.forward_loss(plan("tiny_moe"), params, tokens, labels)
    assert abs(loss - expected) > 4 * tolerance(expected), (loss, expected)


def test_the_strategy_file_lays_the_experts_over_ep(tmp_path):
    """tiny_moe with ep = 2 and zero = 1 (dp 4, tp 2): the experts' device matrix is
    [ep, dp / ep, tp] = [2, 2, 2], their first dim on ep (device dim 2) and ffn on tp
    (dim 0); the parallel optimizer slices them over the dp / ep = 2 ranks holding the
    same experts, tp = 2 ranks apart. The router stays on the stage's [dp, tp], sliced
    over all dp = 4 ranks (4 KiB of fp32 is under hsdp's 64 KiB threshold: not sliced)."""
    import json

    text = emit_fixtures.SPECS["tiny_moe"].read_text()
    text = text.replace("    tp = 2\n}", "    tp = 2\n    ep = 2\n}")
    text = text.replace("hidden   = 64", "hidden   = 128")  # gate: 4 * 128 * 32 * 4 B = 64 KiB
    text = text.replace("    seed         = 1234", "    seed         = 1234\n    zero = 1")
    spec = tmp_path / "tiny_moe.msl"
    spec.write_text(text)
    folder = emit_fixtures.compile_spec(spec, tmp_path / "out")
    items = json.loads((folder / "strategy" / "stage_0.json").read_text())
    layouts = items["parallel_layout_item"]
    for name, tensor_map in (("gate", [2, -1, 0]), ("up", [2, -1, 0]), ("down", [2, 0, -1])):
        for prefix in ("", "adam_m.", "adam_v."):
            got = layouts[f"{prefix}decoder.1.ffn2.{name}"]
            assert got["dev_matrix"] == [2, 2, 2] and got["tensor_map"] == tensor_map
            assert (got["opt_weight_shard_size"], got["opt_weight_shard_step"]) == (2, 2)
    router = layouts["decoder.0.ffn2.router"]
    assert router["dev_matrix"] == [4, 2] and router["tensor_map"] == [-1, -1]
    assert router["opt_weight_shard_size"] == 0


@pytest.fixture
def tiny_moe_ep2(tmp_path, monkeypatch):
    """tiny_moe with ep = 2 (dp 4, tp 2): two expert-parallel groups of two dp ranks."""
    text = emit_fixtures.SPECS["tiny_moe"].read_text()
    path = tmp_path / "tiny_moe_ep2.msl"
    path.write_text(text.replace("    tp = 2\n}", "    tp = 2\n    ep = 2\n}"))
    monkeypatch.setitem(emit_fixtures.SPECS, "tiny_moe_ep2", path)
    return "tiny_moe_ep2"


def test_with_ep_the_experts_matmuls_are_split_over_ep_inside_dp(tiny_moe_ep2, monkeypatch):
    """The instantiated network, as built on Ascend (semi-auto cannot run on the CPU):
    each moe cell's batched matmuls carry in_strategy ((ep, dp / ep, 1), (ep, 1, tp))
    and ((ep, dp / ep, tp), (ep, tp, 1)) = ((2, 2, 1), (2, 1, 2)), ((2, 2, 2), (2, 2,
    1)): every device of the stage (ep * dp / ep * tp = 8) computes its own slice, the
    tokens over the dp / ep ranks of its group; and every strategy of the network fits
    its inputs' shapes (the shape-only trace of test_api_check)."""
    network = instantiate(tiny_moe_ep2, lazy=True, ascend=True, monkeypatch=monkeypatch)
    calls = trace(network, tiny_moe_ep2, shape_only=True)
    assert strategy_problems(calls, stage_devices(tiny_moe_ep2)) == []
    cells = [cell for _, cell in network.cells_and_names() if type(cell).__name__ == "MoE"]
    assert len(cells) == 2
    for cell in cells:
        assert cell.inner.in_strategy == ((2, 2, 1), (2, 1, 2))
        assert cell.outer.in_strategy == ((2, 2, 2), (2, 2, 1))
        assert cell.tile.in_strategy == ((1, 4, 1),)  # the tokens as the dp ranks hold them
        assert cell.weigh.in_strategy == ((2, 2, 1), (2, 2, 1))
        assert cell.expert_sum.in_strategy == ((2, 2, 1),)
    experts = [c for c in calls if c.path.endswith("ffn2.inner")]
    assert experts and all(c.shapes[0] == (4, 128, 64) for c in experts)  # [E, tokens, h]


def test_the_auxiliary_losses_local_never_takes_an_ops_name(tmp_path, monkeypatch):
    """An op named `ffn2_aux`, computed before moe `ffn2` and read after it, keeps its
    value: the auxiliary losses' local of ffn2 takes another name, and the network
    still computes the numpy reference's loss."""
    text = emit_fixtures.SPECS["tiny_moe"].read_text()
    text = text.replace("    ffn2 = moe(", "    ffn2_aux = n2 * 0.5\n    ffn2 = moe(")
    text = text.replace(
        "    output h + ffn2\n", "    mixed = ffn2 + ffn2_aux\n    output h + mixed\n"
    )
    path = tmp_path / "tiny_moe_named.msl"
    path.write_text(text)
    monkeypatch.setitem(emit_fixtures.SPECS, "tiny_moe_named", path)
    model = (emit_fixtures.compiled("tiny_moe_named") / "model.py").read_text()
    assert "ffn2, ffn2_aux_ = self.ffn2(n2)" in model
    network, rng = randomised("tiny_moe_named")
    tokens, labels = batch("tiny_moe_named", rng, rows=2)
    params = {p.name: p.asnumpy() for p in network.get_parameters()}
    loss = mindspore_loss(network, tokens, labels)
    expected = ref.forward_loss(plan("tiny_moe_named"), params, tokens, labels)
    assert abs(loss - expected) <= tolerance(expected), (loss, expected)
