"""The moe op's numbers (msgen/ops/moe_geometry.py `MoeGeometry`) against values derived
by hand in each docstring, and the generated cell's own slot count against the same
one home (`capacity_slots`).

The expert capacity is GShard's (Lepikhin et al. 2020): ceil(k * group tokens * factor
/ experts) slots per expert and group, capped at the group's tokens, as mindformers
2.0.0 defines it (mindformers/modules/transformer/moe.py `calculate_expert_capacity_v2`:
`if tokens_per_group < raw_capacity: raw_capacity = tokens_per_group`; msgen does not
round it up to a multiple of tp as that function also does, its experts' ffn dim, not
their slots, being split over tp).
"""

from __future__ import annotations

import ast
import math
from types import SimpleNamespace

import pytest

from msgen.diagnostics import Span
from msgen.ir.models import OpNode
from msgen.ops.base import Context
from msgen.ops.moe_geometry import MoeGeometry, capacity_slots
from msgen.resources import template

SPAN = Span(file="g.msl", line=1, col=1, end_line=1, end_col=2)


def moe(**args) -> OpNode:
    return OpNode(span=SPAN, name="ffn", kind="moe", args={"experts": 4, "top_k": 2} | args)


def mesh(**sizes) -> Context:
    return Context(mesh_sizes=sizes, dims={}, dtype_bytes=2)


def test_capacity_slots_rows_and_exchanges():
    """x [4, 32, 64] (128 tokens), dp 4: 4 groups of 128 / 4 = 32 tokens; 4 experts, top
    2, factor 0.45: ceil(2 * 32 * 0.45 / 4) = ceil(7.2) = 8 slots per expert and group;
    4 groups x 4 experts x 8 = 128 padded rows; each AllToAll moves 128 x 64 = 8,192."""
    g = MoeGeometry.of(moe(ffn=32, capacity=0.45), (4, 32, 64), mesh(dp=4))
    assert (g.tokens, g.groups, g.group_tokens, g.slots) == (128, 4, 32, 8)
    assert (g.copies, g.rows, g.moved) == (128, 128, 8192)
    assert not g.dropless


def test_the_capacity_is_capped_at_the_groups_tokens():
    """Factor 3 with 4 experts, top 2, groups of 32: ceil(2 * 32 * 3 / 4) = 48 slots
    wanted, but a token chooses an expert once, so at most 32 fill it
    (calculate_expert_capacity_v2's cap): 2 groups x 4 experts x 32 = 256 rows, not
    the 384 of an uncapped 48."""
    g = MoeGeometry.of(moe(ffn=32, capacity=3.0), (2, 32, 64), mesh(dp=2))
    assert (g.group_tokens, g.slots, g.copies, g.rows) == (32, 32, 256, 256)
    assert capacity_slots(32, 2, 4, 3.0) == 32
    assert capacity_slots(32, 2, 4, 2.0) == 32  # exactly the group: ceil(32) = 32
    assert capacity_slots(32, 2, 4, 1.9) == 31  # ceil(30.4)


def test_dropless_rows_are_the_routed_copies_times_the_imbalance():
    """Dropless, 128 tokens, top 2: 256 routed copies, one group of all 128 tokens; the
    busiest rank at imbalance 1.3 computes 256 x 1.3 = 332.8 rows' worth (the work
    counts the fraction), its buffers and exchanges hold ceil(332.8) = 333 rows of 64."""
    g = MoeGeometry.of(moe(ffn=32, imbalance=1.3), (4, 32, 64), mesh(dp=4))
    assert g.dropless and g.slots is None
    assert (g.groups, g.group_tokens, g.copies) == (1, 128, 256)
    assert g.loaded == pytest.approx(332.8)
    assert (g.rows, g.moved) == (333, 333 * 64)


def test_the_devices_and_experts_per_rank_follow_megatrons_order():
    """dp 8 with ep 2 inside it, tp 4: the Layouts' device matrix [dp / ep, ep, tp] =
    [4, 2, 4] (tp innermost, then ep); 8 experts over ep 2: 4 per rank."""
    g = MoeGeometry.of(moe(experts=8, ffn=32, capacity=1.0), (8, 16, 64), mesh(dp=8, ep=2, tp=4))
    assert g.devices == (4, 2, 4)
    assert g.experts_per_rank == 4
    # GShard's groups are the dp ranks: 8 groups of 128 / 8 = 16 tokens, ceil(2 * 16 / 8)
    assert (g.groups, g.group_tokens, g.slots) == (8, 16, 4)


def test_the_ffn_axes_tp_with_a_capacity_and_whole_experts_dropless():
    """Expert tensor parallelism = tp (Megatron-LM's default) with a capacity: the
    experts' ffn dim over tp; dropless each expert whole over tp (the Morph region hands
    each tp rank tokens of its own), the shared experts still over tp; tp 1 splits
    nothing."""
    ctx = mesh(dp=8, ep=2, tp=4)
    capacity = MoeGeometry.of(moe(ffn=32, capacity=1.0), (8, 16, 64), ctx)
    dropless = MoeGeometry.of(moe(ffn=32), (8, 16, 64), ctx)
    alone = MoeGeometry.of(moe(ffn=32, capacity=1.0), (8, 16, 64), mesh(dp=8, ep=2))
    assert (capacity.tp_axes, capacity.expert_ffn_axes) == (("tp",), ("tp",))
    assert (dropless.tp_axes, dropless.expert_ffn_axes) == (("tp",), ())
    assert (alone.tp_axes, alone.expert_ffn_axes) == ((), ())


def generated_slots():
    """The generated MoE cell's `slots` method, as templates/ops/moe_capacity.py.j2 writes
    it, compiled on its own (it reads only math and its cell's three settings)."""
    source = template("ops/moe.py.j2").render(permute=False, biased=False)
    cell = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef))
    method = next(n for n in cell.body if isinstance(n, ast.FunctionDef) and n.name == "slots")
    space: dict = {"math": math}
    exec(compile(ast.Module([method], []), "moe.py", "exec"), space)  # noqa: S102
    return space["slots"]


@pytest.mark.parametrize("factor", [0.45, 1.0, 1.1, 1.25, 2.0, 3.0])
@pytest.mark.parametrize("experts,top_k", [(4, 2), (8, 2), (64, 6), (2, 1)])
def test_the_generated_cell_counts_the_slots_the_estimate_counts(factor, experts, top_k):
    """The cell computes its slots from its tensors' shapes at run time; over groups of
    1 to 300 tokens it must give what `capacity_slots` gives the estimate."""
    slots = generated_slots()
    cell = SimpleNamespace(top_k=top_k, experts=experts, capacity=factor)
    for group in range(1, 301):
        assert slots(cell, group) == capacity_slots(group, top_k, experts, factor), group
