"""The mesh's one owner (msgen/ir/mesh.py) against Megatron-LM's rank groups, and
the groups plan.json lists against the generated code's own: expert groups inside a
server where ep x tp fits one, as Megatron-LM lays them.

The oracle for the groups is Megatron-LM's definition (megatron/core/parallel_state.py,
`generate_masked_orthogonal_rank_groups` and `RankGenerator`): the ranks are the
row-major arange over the sizes in the order "tp-cp-ep-dp-pp", tp varying fastest (the
expert generator's `dp` is the expert data-parallel size, dp / ep; the dense one has
ep = 1 and dp whole), and a group over some dims is the ranks that differ only there,
the groups listed by their first rank. numpy writes that as a reshape."""

from __future__ import annotations

import json
import sys
from math import prod

import numpy as np
import pytest

from msgen.compiler import analyze_text
from msgen.estimate.op_time import Machine, group_bytes
from msgen.ir.devices import DEVICES
from msgen.ir.mesh import RankMesh
from msgen.ops import moe_geometry
from msgen.ops.base import Context
from tests import emit_fixtures


def megatron_groups(sizes: dict[str, int], dims: tuple[str, ...]) -> list[list[int]]:
    """Megatron-LM's groups over `dims` of a mesh whose `sizes` are given innermost
    first (tp, ep, dp, pp): numpy's grid is outermost first, so the order reverses."""
    names = list(sizes)[::-1]
    grid = np.arange(prod(sizes.values())).reshape([sizes[n] for n in names])
    varied = sorted(names.index(d) for d in dims)
    kept = [i for i in range(len(names)) if i not in varied]
    size = prod(sizes[d] for d in dims)
    return np.transpose(grid, kept + varied).reshape(-1, size).tolist()


MESHES = [  # dp, tp, pp, ep
    (16, 1, 1, 8),
    (8, 2, 1, 8),
    (4, 2, 2, 2),
    (6, 2, 3, 3),
    (4, 1, 2, 1),
]


@pytest.mark.parametrize("dp, tp, pp, ep", MESHES)
def test_every_group_is_megatrons(dp, tp, pp, ep):
    """The expert generator (tp, ep, dp / ep, pp) gives the tp, ep, expert
    data-parallel and pp groups; the dense one (tp, dp, pp) the dp groups, which are
    the expert generator's ep-dp groups."""
    mesh = RankMesh(dp, tp, pp, ep, per_node=8)
    expert = {"tp": tp, "ep": ep, "dp": dp // ep, "pp": pp}
    dense = {"tp": tp, "dp": dp, "pp": pp}
    assert [list(g) for g in mesh.groups("tp")] == megatron_groups(expert, ("tp",))
    assert [list(g) for g in mesh.groups("ep")] == megatron_groups(expert, ("ep",))
    assert [list(g) for g in mesh.groups("edp")] == megatron_groups(expert, ("dp",))
    assert [list(g) for g in mesh.groups("pp")] == megatron_groups(expert, ("pp",))
    assert [list(g) for g in mesh.groups("dp")] == megatron_groups(dense, ("dp",))
    assert megatron_groups(dense, ("dp",)) == megatron_groups(expert, ("ep", "dp"))
    for rank in range(mesh.devices):  # the design's rank order for the dense layers
        at = mesh.coordinates(rank)
        dp_index = at["edp"] * ep + at["ep"]
        assert mesh.rank(at["pp"], dp_index, at["tp"]) == rank


@pytest.mark.parametrize("dp, tp, pp, ep", MESHES)
def test_each_ranks_stage_and_each_stages_first_rank_are_megatrons(dp, tp, pp, ep):
    """A rank's stage is its index along pp in Megatron-LM's grid (pp outermost), a
    stage's ranks its slice of the grid, and a stage's first rank the smallest of its
    ranks: what the dry run, doctor, report and the checkpoint tools read a rank's
    stage and a stage's ranks from."""
    mesh = RankMesh(dp, tp, pp, ep, per_node=8)
    grid = np.arange(mesh.devices).reshape(pp, dp // ep, ep, tp)
    for stage in range(pp):
        assert {mesh.stage_of(int(r)) for r in grid[stage].ravel()} == {stage}
        # its ranks by local rank: the stage's grid row-major, as its device matrix
        assert list(mesh.stage_ranks(stage)) == grid[stage].ravel().tolist()
    assert mesh.first_ranks() == tuple(int(grid[s].min()) for s in range(pp))
    # The strategy file's device matrix: a stage's grid as a MindSpore Layout lays it.
    assert mesh.dev_matrix(expert=True) == list(grid.shape[1:])
    assert mesh.dev_matrix(expert=False) == [dp, tp]


@pytest.mark.parametrize("dp, tp, pp, ep", MESHES)
def test_each_servers_ranks_are_a_row_of_the_grid(dp, tp, pp, ep):
    """Servers take consecutive ranks (msrun's --node_rank and the rank table number
    a node's devices after the previous node's): the rank range reshaped to one row a
    server, for each server size that divides the devices. What the launch scripts'
    node lists and hccl.json's rank_ids print."""
    for per_node in (n for n in (1, 2, 4, 8) if dp * tp * pp % n == 0):
        mesh = RankMesh(dp, tp, pp, ep, per_node=per_node)
        rows = np.arange(mesh.devices).reshape(-1, per_node).tolist()
        assert [list(r) for r in mesh.servers_ranks()] == rows
        assert all(mesh.server(r) == s for s, row in enumerate(rows) for r in row)


def generated_expert_ranks():
    """The generated moe cell's `expert_ranks(rank, devices)` as the template writes it
    (templates/ops/moe_permute.py.j2 `region`), alone: one model.py serves every rank,
    so each rank computes its group at run time from the stage's device matrix."""
    import ast

    from msgen.resources import template

    text = str(template("ops/moe_permute.py.j2").module.region())
    (function,) = [
        node
        for node in ast.parse(text).body
        if isinstance(node, ast.FunctionDef) and node.name == "expert_ranks"
    ]
    names: dict = {}
    exec(compile(ast.Module([function], []), "moe_permute.py.j2", "exec"), names)  # noqa: S102
    return names["expert_ranks"]


EXPERT_MESHES = MESHES + [(8, 4, 2, 4), (64, 1, 4, 8), (32, 2, 2, 16), (6, 3, 1, 2)]


@pytest.mark.parametrize("dp, tp, pp, ep", EXPERT_MESHES)
def test_each_ranks_expert_group_is_megatrons_in_the_owner_and_the_generated_code(dp, tp, pp, ep):
    """For every rank: the owner's expert group is the Megatron-LM ep group holding
    it, its index there the rank's place in it; the generated code's, given the
    stage's device matrix ([dp / ep, ep, tp], the moe op's and the owner's), is the
    owner's."""
    mesh = RankMesh(dp, tp, pp, ep, per_node=8)
    expert_ranks = generated_expert_ranks()
    # The device matrix the moe op hands the generated cell (`devices=`, which asks the
    # owner) is a stage of Megatron-LM's grid, outermost first.
    sizes = {"dp": dp, "tp": tp, "pp": pp, "ep": ep}
    laid = moe_geometry.devices(Context(mesh_sizes=sizes, dims={}, dtype_bytes=4))
    grid = np.arange(mesh.devices).reshape(pp, dp // ep, ep, tp)
    assert list(laid) == list(grid.shape[1:])
    groups = megatron_groups({"tp": tp, "ep": ep, "dp": dp // ep, "pp": pp}, ("ep",))
    for rank in range(mesh.devices):
        (group,) = [g for g in groups if rank in g]
        assert mesh.expert_group(rank) == (tuple(group), group.index(rank)), rank
        ranks, index = expert_ranks(rank, laid)
        assert (list(ranks), index) == (group, group.index(rank)), rank


@pytest.mark.parametrize("dp, tp, pp, ep", MESHES)
def test_a_groups_size_without_some_axes_counts_megatrons_groups_inside_it(dp, tp, pp, ep):
    """The ranks of a group over dp (or dp and tp) less the coordinates ep varies are
    how many of Megatron-LM's ep groups one such group holds (dp / ep, dp / ep x tp):
    what the estimate divides a tensor split over those axes by for the bytes one ep
    group's all-to-all moves."""
    mesh = RankMesh(dp, tp, pp, ep, per_node=8)
    expert = {"tp": tp, "ep": ep, "dp": dp // ep, "pp": pp}
    ep_groups = megatron_groups(expert, ("ep",))
    for axes, dims in ((("dp",), ("ep", "dp")), (("dp", "tp"), ("tp", "ep", "dp"))):
        for outer in megatron_groups(expert, dims):
            inside = [g for g in ep_groups if set(g) <= set(outer)]
            assert mesh.size(axes, without="ep") == len(inside), (axes, outer)
    assert mesh.size(("dp", "tp"), without="tp") == dp


def test_a_group_that_fits_a_servers_size_can_still_straddle_two():
    """dp 12 with ep 3 (tp 1, pp 2) on 8-device servers: the ep group [6, 7, 8] is 3
    consecutive ranks, fewer than a server holds, yet ranks 6 and 7 are on server 0 and
    8 on server 1; a span-based rule (3 <= 8: inside a server) says otherwise. The
    estimate charges its all-to-all the inter-server link."""
    mesh = RankMesh(12, 1, 2, 3, per_node=8)
    assert mesh.groups("ep")[2] == (6, 7, 8)
    assert mesh.servers((6, 7, 8)) == (0, 1)
    assert not mesh.in_server("ep") and mesh.spans("ep") == 2
    device = DEVICES["ascend910b"]
    assert Machine(device, 1.0, mesh, {}).link(("ep",)) == device.inter


def moe_spec(tmp_path, dp: int, tp: int, ep: int, capacity: float | None = None):
    """tests/specs/tiny_moe.msl with 8 experts on two servers of 8 devices (16), dp x tp
    = 16 and ep inside dp; dropless, or with a capacity."""
    text = emit_fixtures.SPECS["tiny_moe"].read_text()
    if capacity is not None:
        text = text.replace("aux_loss = 0.01", f"capacity = {capacity}, aux_loss = 0.01")
    text = text.replace('nodes    = ["127.0.0.1"]', 'nodes    = ["10.0.0.1", "10.0.0.2"]')
    text = text.replace(
        "    dp = 4\n    tp = 2\n}", f"    dp = {dp}\n    tp = {tp}\n    ep = {ep}\n}}"
    )
    text = text.replace("experts = 4", "experts = 8")
    text = text.replace("global_batch = 8 ", f"global_batch = {dp * 2} ")
    path = tmp_path / f"moe_dp{dp}_tp{tp}_ep{ep}.msl"
    path.write_text(text)
    return path


@pytest.mark.parametrize("dp, tp, servers", [(16, 1, 1), (8, 2, 2)])
def test_the_generated_expert_group_of_each_rank_is_plan_jsons(tmp_path, dp, tp, servers):
    """dp 16 / ep 8 / tp 1 on two 8-device servers: every ep group plan.json lists lies
    in one server ([0 .. 7] and [8 .. 15]: ep x tp = 8 fills a server). dp 8 / ep 8 /
    tp 2: ep x tp = 16 > 8, each group ([0, 2, .., 14], [1, 3, .., 15]) spans both.
    Either way the generated code's `expert_ranks` (templates/ops/moe_permute.py.j2,
    what each rank hands create_group) gives every rank the group plan.json lists it
    in, and its index there."""
    folder = emit_fixtures.compile_spec(moe_spec(tmp_path, dp, tp, 8), tmp_path / "out")
    doc = json.loads((folder / "plan.json").read_text())
    groups = doc["groups"]["ep"]
    assert sorted(r for g in groups for r in g) == list(range(16))
    assert {len({r // 8 for r in g}) for g in groups} == {servers}
    assert doc["group_servers"]["ep"] == servers
    model = emit_fixtures.load(folder, "model")
    for rank in range(16):
        (listed,) = [g for g in groups if rank in g]
        assert model.expert_ranks(rank, (dp // 8, 8, tp)) == (listed, listed.index(rank))


def analysed(tmp_path, dp: int, tp: int):
    result = analyze_text(moe_spec(tmp_path, dp, tp, 8).read_text(), "moe.msl", tmp_path)
    assert result.ok, [d.message for d in result.diagnostics if d.is_error]
    return result


@pytest.mark.parametrize(
    "dp, tp, want",
    [
        (16, 1, 7 / 8 * 131072 / 8 / (56e9 * 0.33 * 7) + 7 * 10e-6),
        (8, 2, 7 / 8 * 65536 / 8 / (25e9 * 0.8) + 7 * 15e-6),
    ],
)
def test_an_all_to_all_pays_the_link_its_group_spans(tmp_path, dp, tp, want):
    """One dispatch of tiny_moe (8 experts, top 2, hidden 64, fp32) on two servers of
    8 Ascend 910B, by hand. dp 16 / ep 8 / tp 1: a micro-batch is 16 sequences of 32,
    512 tokens, 1,024 copies of 64 values; an ep group holds 8 of the 16 dp shards,
    1024 x 64 x 4 / 2 = 131,072 bytes, inside one server (ranks 0 .. 7): HCCS, a full
    mesh, 7 links of 56 GB/s x 0.33 for a group of 8, each rank sending 7/8 of its
    131,072 / 8 bytes, plus 7 latency steps of 10 us (7.01e-5 s). dp 8 / ep 8 / tp 2:
    8 sequences, 512 copies, each tp rank exchanging its own tokens' (dropless),
    512 x 64 x 4 / 2 = 65,536 bytes per group, whose ranks 0, 2, .., 14 span both
    servers: RoCE, 25 GB/s x 0.8, and 7 steps of 15 us (1.05e-4 s)."""
    result = analysed(tmp_path, dp, tp)
    of = result.facts.graphs["decoder"].ops["ffn2"]
    (dispatch,) = [c for c in of.layout.collectives if c.what == "dispatch"]
    m = result.spec.mesh
    sizes = {"dp": m.dp, "tp": m.tp, "pp": m.pp, "ep": m.ep}
    device = DEVICES["ascend910b"]
    machine = Machine(device, device.matmul_flops["fp32"], RankMesh.of(result.spec), sizes)
    got = machine.axes_time(dispatch, group_bytes(dispatch, of.layout, machine.mesh, 4))
    assert abs(got - want) < 1e-12 * want


def test_plan_json_lists_the_groups_one_a_line(tmp_path):
    """The groups stay readable for a large mesh: one rank list a line."""
    folder = emit_fixtures.compile_spec(moe_spec(tmp_path, 16, 1, 8), tmp_path / "out")
    text = (folder / "plan.json").read_text()
    assert "      [0, 1, 2, 3, 4, 5, 6, 7],\n      [8, 9, 10, 11, 12, 13, 14, 15]\n" in text


def along(matrix, dim: int) -> list[list[int]]:
    """The ranks of a device matrix that differ only along device dim `dim` (counted
    from the right, as tensor maps count: mindspore/parallel/shard.py `Layout`; its
    ranks the row-major range), by first rank."""
    grid = np.arange(prod(matrix)).reshape(matrix)
    axis = len(matrix) - 1 - dim
    return sorted(np.moveaxis(grid, axis, -1).reshape(-1, matrix[axis]).tolist())


@pytest.mark.parametrize("capacity", [None, 1.0])
def test_the_layouts_and_the_strategy_file_split_the_experts_over_plan_jsons_ep_groups(
    tmp_path, monkeypatch, capacity
):
    """dp 8 / ep 4 / tp 2 on two servers: the ranks among which a moe op's experts are
    split (those differing only along the device dim the experts' dim is mapped to)
    are plan.json's ep groups ([0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], ...), in the
    Layouts the generated cells shard by (the dropless Morph region's experts, the
    capacity path's batched matmuls' weights) and in the expected strategy file."""
    import mindspore as ms
    from mindspore.nn.utils import no_init_parameters

    folder = emit_fixtures.compile_spec(moe_spec(tmp_path, 8, 2, 4, capacity), tmp_path / "out")
    doc = json.loads((folder / "plan.json").read_text())
    want = sorted(doc["groups"]["ep"])
    assert want[:2] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    items = json.loads((folder / "strategy" / "stage_0.json").read_text())
    for name in ("gate", "up", "down"):
        laid = items["parallel_layout_item"][f"decoder.1.ffn2.{name}"]
        assert along(laid["dev_matrix"], laid["tensor_map"][0]) == want, name
    model = emit_fixtures.load(folder, "model")
    monkeypatch.setitem(sys.modules, model.__name__, model)  # graph mode reads its globals
    before = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)  # the Morph region is built in graph mode only
    try:
        with no_init_parameters():
            network = emit_fixtures.network_class(model, doc)()
    finally:
        ms.set_context(mode=before)
    cells = [cell for _, cell in network.cells_and_names() if type(cell).__name__ == "MoE"]
    assert len(cells) == 2
    for cell in cells:
        if capacity is None:
            experts = cell.region.attrs["in_layout"][3:]  # gate, up, down
        else:
            experts = (cell.inner.attrs["in_layout"][1], cell.outer.attrs["in_layout"][1])
        for layout in experts:
            assert along(layout["device_matrix"], layout["tensor_map"][0]) == want


def train_py_rank_arithmetic(folder) -> tuple[dict, dict]:
    """train.py's module constants and its main()'s `stage, dp_index = ...` and
    `prints = ...` statements, as expressions to evaluate per rank."""
    import ast

    def target(node) -> str:
        return ", ".join(ast.unparse(t) for t in getattr(node, "elts", [node]))

    module = ast.parse((folder / "train.py").read_text())
    constants = {}
    for node in module.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Constant, ast.Tuple)):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                continue
            names = target(node.targets[0]).split(", ")
            constants.update(zip(names, value if len(names) > 1 else (value,), strict=True))
    statements = {
        target(node.targets[0]): compile(ast.Expression(node.value), "train.py", "eval")
        for node in ast.walk(module)
        if isinstance(node, ast.Assign) and target(node.targets[0]) in ("stage, dp_index", "prints")
    }
    return constants, statements


@pytest.mark.parametrize("ep", [1, 4])
def test_train_pys_stage_and_dp_index_of_each_rank_are_plan_jsons(tmp_path, ep):
    """train.py reads its stage and dp index (the data shard it reads) from the strides
    the mesh's owner emits: for every rank they are its index in plan.json's pp group
    and dp group, and the rank that prints is the last stage's first. tiny (dp 2, tp 2,
    pp 2) and tiny_moe at dp 8, tp 2, ep 4 on two servers (ep inside dp)."""
    if ep == 1:
        folder = emit_fixtures.compiled("tiny")
    else:
        folder = emit_fixtures.compile_spec(moe_spec(tmp_path, 8, 2, ep), tmp_path / "out")
    doc = json.loads((folder / "plan.json").read_text())
    constants, statements = train_py_rank_arithmetic(folder)
    last_stage = doc["mesh"]["pp"] - 1
    for rank in range(doc["devices"]):
        names = {**constants, "rank": rank, "distributed": True}
        stage, dp_index = eval(statements["stage, dp_index"], names)  # noqa: S307
        (pp_group,) = [g for g in doc["groups"]["pp"] if rank in g]
        (dp_group,) = [g for g in doc["groups"]["dp"] if rank in g]
        assert (stage, dp_index) == (pp_group.index(rank), dp_group.index(rank)), rank
        first_of_last = min(g[last_stage] for g in doc["groups"]["pp"])
        assert eval(statements["prints"], names) == (rank == first_of_last), rank  # noqa: S307
