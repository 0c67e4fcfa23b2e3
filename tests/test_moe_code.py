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

import json
from math import prod

import pytest

from tests import emit_fixtures, test_op_moe
from tests import reference_numpy as ref
from tests.emit_fixtures import holders, plan
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
    "tiny_moe_shared_sigmoid": "shared_sigmoid = true, norm_topk = false, ",
    # DeepSeek-V3's routing (the correction bias random as every parameter), and
    # DeepSeek-V2's group_limited_greedy
    "tiny_moe_deepseek_v3": "router = sigmoid, expert_bias = true, expert_groups = 2, "
    "top_groups = 1, routed_scaling = 2.5, seq_aux_loss = 0.003, ",
    "tiny_moe_group_limited": "expert_groups = 2, top_groups = 1, group_score = max, "
    "norm_topk = false, ",
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


def loss_is_numpys(name):
    """The compiled network's loss over random weights and a batch of two rows equals
    the numpy reference's forward loss."""
    network, rng = randomised(name)
    tokens, labels = batch(name, rng, rows=2)
    params = {p.name: p.asnumpy() for p in network.get_parameters()}
    loss = mindspore_loss(network, tokens, labels)
    expected = ref.forward_loss(plan(name), params, tokens, labels)
    assert abs(loss - expected) <= tolerance(expected), (loss, expected)


def test_the_permuting_moe_computes_its_reference():
    """tiny_moe_dp (a data-parallel mesh): the dropless op runs the permuting
    dispatcher (tests/test_moe_permute.py checks its parts), and its network's loss
    and gradient are numpy's."""
    model = (emit_fixtures.compiled("tiny_moe_dp") / "model.py").read_text()
    assert "capacity=None" in model and "def routed(" in model and "devices=(" not in model
    computes_its_reference("tiny_moe_dp")
    loss_is_numpys("tiny_moe_dp")


def test_moe_code_imports_what_it_uses():
    imports_what_it_uses("tiny_moe")


@pytest.mark.parametrize("variant", ["tiny_moe_deepseek_v3"], indirect=True)
def test_the_deepseek_routing_imports_what_it_uses(variant):
    imports_what_it_uses(variant)


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


@pytest.mark.parametrize(
    "variant", ["tiny_moe", "tiny_moe_shared_sigmoid", "tiny_moe_deepseek_v3"], indirect=True
)
def test_strategies_fit_the_inputs_and_the_shape_only_trace_agrees(variant):
    network = instantiate(variant, lazy=False)
    real = trace(network, variant, shape_only=False)
    assert real and strategy_problems(real, stage_devices(variant)) == []
    assert unexercised(network, real) == set()
    shaped = trace(instantiate(variant, lazy=True), variant, shape_only=True)
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


@pytest.mark.parametrize("capacity", [None, 0.5])
def test_the_strategy_file_lays_the_experts_over_ep(tmp_path, capacity):
    """tiny_moe with 8 experts, ep = 2 and zero = 1 (dp 4, tp 2): the experts' device
    matrix is [dp / ep, ep, tp] = [2, 2, 2] (Megatron-LM's order: tp innermost, then
    ep), their first dim on ep (device dim 1); with a capacity their ffn dim on tp
    (dim 0), dropless whole (the Morph region's layout,
    templates/ops/moe_permute.py.j2 `region`). The parallel optimizer splits a slice
    over every rank of the stage holding it (operator_info.cc, CreateGroupForOptShard):
    with a capacity the edp group, dp / ep = 2 ranks ep x tp = 4 apart (rank 0's
    experts are ep index 0 of edp index 0, rank 4's of edp index 1; their 4 local
    experts divide by 2); dropless, whole over tp, the edp groups of rank 0's tp group,
    ranks 0, 1, 4, 5: 4 of them (4 local experts divide by 4), recorded with the
    stride MindSpore computes, (5 - 0) // (4 - 1) = 1. Each of the 8 x 128 x 32 x 4 B =
    128 KiB passes hsdp's 64 KiB threshold. The router [128, 8] stays on the stage's
    [dp, tp], whole (4 KiB of fp32, under the threshold: not sliced); the embedding
    table [256, 128] (128 KiB), whole over tp, is split over all 8 ranks of the stage.
    The ranks are read from plan.json's groups."""

    text = emit_fixtures.SPECS["tiny_moe"].read_text()
    text = text.replace("    tp = 2\n}", "    tp = 2\n    ep = 2\n}")
    text = text.replace("hidden   = 64", "hidden   = 128").replace("experts = 4", "experts = 8")
    text = text.replace("    seed         = 1234", "    seed         = 1234\n    zero = 1")
    if capacity:
        text = text.replace("aux_loss = 0.01", f"capacity = {capacity}, aux_loss = 0.01")
    spec = tmp_path / "tiny_moe.msl"
    spec.write_text(text)
    folder = emit_fixtures.compile_spec(spec, tmp_path / "out")
    doc = json.loads((folder / "plan.json").read_text())
    group = holders(doc, 0, ("edp",) if capacity else ("edp", "tp"))
    assert group == ([0, 4] if capacity else [0, 1, 4, 5])
    items = json.loads((folder / "strategy" / "stage_0.json").read_text())
    layouts = items["parallel_layout_item"]
    maps = {"gate": [1, -1, 0], "up": [1, -1, 0], "down": [1, 0, -1]}
    if capacity is None:
        maps = dict.fromkeys(maps, [1, -1, -1])
    shard = (len(group), (group[-1] - group[0]) // (len(group) - 1))
    for name, tensor_map in maps.items():
        for prefix in ("", "adam_m.", "adam_v."):
            got = layouts[f"{prefix}decoder.1.ffn2.{name}"]
            assert got["dev_matrix"] == [2, 2, 2] and got["tensor_map"] == tensor_map
            assert (got["opt_weight_shard_size"], got["opt_weight_shard_step"]) == shard
    router = layouts["decoder.0.ffn2.router"]
    assert router["dev_matrix"] == [4, 2] and router["tensor_map"] == [-1, -1]
    assert router["opt_weight_shard_size"] == 0
    # the embedding table [256, 128], whole over tp: every rank of the stage, 1 apart
    emb = layouts["emb.table"]
    stage = holders(doc, 0, ("dp", "tp"))
    assert stage == list(range(8)) and emb["tensor_map"] == [-1, -1]
    assert (emb["opt_weight_shard_size"], emb["opt_weight_shard_step"]) == (8, 1)


def recorded_layouts(name: str) -> dict[tuple[str, str], tuple[dict, ...]]:
    """(cell path, primitive) -> in_layout, for every primitive laid by Layouts."""
    from mindspore.nn.utils import no_init_parameters

    with no_init_parameters():
        network = emit_fixtures.network_class(
            emit_fixtures.load(emit_fixtures.compiled(name), "model"),
            emit_fixtures.plan_json(name),
        )()
    return {
        (path, attr): prim.attrs["in_layout"]
        for path, cell in network.cells_and_names()
        for attr, prim in cell._primitives.items()
        if prim is not None and "in_layout" in prim.attrs
    }


def slices(layout: dict) -> tuple[int, ...]:
    """How many slices a Layout cuts each tensor dim into: the device dim its tensor
    map names (counted from the right, as mindspore/parallel/shard.py `Layout` maps
    them), or whole."""
    matrix = layout["device_matrix"][::-1]
    return tuple(matrix[m] if m >= 0 else 1 for m in layout["tensor_map"])


@pytest.mark.parametrize("capacity", [None, 0.5])
def test_the_router_and_shared_experts_are_laid_as_megatrons(tmp_path, monkeypatch, capacity):
    """tiny_moe with ep = 2 (dp 4, tp 2), dropless and with a capacity: the MatMuls of
    the router and the shared experts carry Megatron-LM's layout (tests/
    test_strategy_oracle.py's `column` and `row`): the router whole (router.py's
    TopKRouter weight is a plain Parameter, on every tensor-parallel rank), the shared
    gate and up column parallel and the shared down row parallel (shared_experts.py's
    SharedExpertMLP is an MLP: ColumnParallelLinear, then RowParallelLinear), the
    tokens over dp. plan.json's splits of those matrices and of the input, and the
    strategy file's tensor maps, give the same slices; with a capacity the experts'
    batched matmuls lay gate, up and down as plan.json does."""
    from tests.test_parallel_audit import splits
    from tests.test_strategy_oracle import column, recorded, row

    name = f"tiny_moe_ep2_{capacity}"
    text = emit_fixtures.SPECS["tiny_moe"].read_text()
    text = text.replace("    tp = 2\n}", "    tp = 2\n    ep = 2\n}")
    if capacity:
        text = text.replace("aux_loss = 0.01", f"capacity = {capacity}, aux_loss = 0.01")
    path = tmp_path / f"{name}.msl"
    path.write_text(text)
    monkeypatch.setitem(emit_fixtures.SPECS, name, path)
    dp, tp = 4, 2
    megatron = {
        "route_matmul": ((dp, 1), (1, 1)),
        "shared_gate_matmul": column(dp, tp),
        "shared_up_matmul": column(dp, tp),
        "shared_down_matmul": row(dp, tp),
    }
    found, by_layout = recorded(name), recorded_layouts(name)
    doc = emit_fixtures.plan_json(name)
    (op,) = {op["name"]: op for op in doc["ops"]["decoder"] if op["kind"] == "moe"}.values()
    rows = prod(splits(op["input_splits"][0], doc["mesh"])[:-1])
    files = json.loads((emit_fixtures.compiled(name) / "strategy" / "stage_0.json").read_text())
    layouts = files["parallel_layout_item"]
    weights = {"route_matmul": "router", "shared_gate_matmul": "shared_gate",
               "shared_up_matmul": "shared_up", "shared_down_matmul": "shared_down"}  # fmt: skip
    for copy in (0, 1):
        cell = f"decoder.{copy}.ffn2"
        for attr, wanted in megatron.items():
            strategy = found[(cell, attr)]
            assert strategy == wanted, (cell, attr, strategy)
            split = splits(op["params"][weights[attr]], doc["mesh"])
            assert strategy[1] == split and strategy[0][0] == rows, (attr, split, rows)
            laid = layouts[f"{cell}.{weights[attr]}"]
            matrix = laid["dev_matrix"][::-1]
            assert strategy[1] == tuple(matrix[m] if m >= 0 else 1 for m in laid["tensor_map"])
        experts = {"inner": ("gate", "up"), "outer": ("down",)}
        for attr, params in experts.items():
            if capacity is None:
                assert (cell, attr) not in found and (cell, attr) not in by_layout
                continue
            # the stage's devices in Megatron-LM's order, [dp / ep, ep, tp]
            x, w = by_layout[(cell, attr)]
            assert x["device_matrix"] == w["device_matrix"] == (dp // 2, 2, tp)
            for param in params:
                assert slices(w) == splits(op["params"][param], doc["mesh"])


@pytest.fixture
def tiny_moe_ep2(tmp_path, monkeypatch):
    """tiny_moe with ep = 2 (dp 4, tp 2): two expert-parallel groups of two dp ranks."""
    text = emit_fixtures.SPECS["tiny_moe"].read_text()
    path = tmp_path / "tiny_moe_ep2.msl"
    path.write_text(text.replace("    tp = 2\n}", "    tp = 2\n    ep = 2\n}"))
    monkeypatch.setitem(emit_fixtures.SPECS, "tiny_moe_ep2", path)
    return "tiny_moe_ep2"


def test_with_ep_the_dropless_region_is_laid_over_the_stage(tiny_moe_ep2, monkeypatch):
    """The instantiated network, as built on Ascend in graph mode (semi-auto cannot run
    on the CPU): each moe cell runs its dispatcher as a Morph region with
    self_define_shard, laid over the stage's devices [dp / ep, ep, tp] = [2, 2, 2]: the
    tokens, their weights and experts split over all 8 (tensor map (2, 1, 0) on their
    first dim), the experts' matrices over ep (device dim 1) and whole otherwise, the
    output as the tokens; its experts are GroupedMatmul. The shape-only trace runs the
    region's body: each rank's share of a micro-batch's 4 * 32 tokens divides evenly,
    and the grouped matmuls see the routed copies only (128 * top_k 2 = 256 rows,
    hidden 64 -> ffn 32), never the experts times the tokens."""
    import sys

    import mindspore as ms
    from mindspore.nn.utils import no_init_parameters
    from mindspore.ops.auto_generate import GroupedMatmul

    model = emit_fixtures.load(emit_fixtures.compiled(tiny_moe_ep2), "model")
    monkeypatch.setitem(sys.modules, model.__name__, model)  # graph mode reads its globals
    get_context = ms.get_context
    monkeypatch.setattr(
        ms, "get_context", lambda key: "Ascend" if key == "device_target" else get_context(key)
    )
    before = get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        with no_init_parameters():
            network = emit_fixtures.network_class(model, emit_fixtures.plan_json(tiny_moe_ep2))()
    finally:
        ms.set_context(mode=before)
    cells = [cell for _, cell in network.cells_and_names() if type(cell).__name__ == "MoE"]
    assert len(cells) == 2
    mesh = {"device_matrix": (2, 2, 2), "interleaved_parallel": False,
            "alias_name": ("edp", "ep", "tp")}  # fmt: skip
    tokens, experts = mesh | {"tensor_map": ((2, 1, 0), -1)}, mesh | {"tensor_map": (1, -1, -1)}
    for cell in cells:
        region = cell.region
        assert type(region).__name__ == "Morph" and region.attrs["self_define_shard"]
        assert region.attrs["in_layout"] == (tokens,) * 3 + (experts,) * 3
        assert region.attrs["out_layout"] == (tokens,)
        assert isinstance(cell.gmm, GroupedMatmul)
        assert cell.swap is None  # no communication initialised: one process's exchange
    calls = trace(network, tiny_moe_ep2, shape_only=True)
    regions = [c.shapes[0] for c in calls if c.path.endswith("ffn2.region")]
    assert regions and all(n % 8 == 0 for n, _ in regions), regions
    gmm = [c.shapes for c in calls if c.path.endswith("ffn2.gmm")]
    assert gmm and all(s[0] in ((256, 64), (256, 32)) for s in gmm), gmm


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
    loss_is_numpys("tiny_moe_named")
