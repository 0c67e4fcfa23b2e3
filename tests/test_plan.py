"""The Plan's pipeline placement (msgen/analysis/placement.py) against layers placed one by one, the
fusion tables the emitters take from it, and what `check` says about fusion kinds.

The placement: the repeated layers (one global index over every repeat) run through
virtual stages v = 0 .. pp * chunks - 1 in order; v is stage v % pp, segment v // pp;
stage s holds stage_split[s] layers, divided over its chunks by the balanced rule.
"""

from __future__ import annotations

import random
import time
from types import SimpleNamespace

import pytest

from msgen.analysis.placement import balanced_split
from msgen.analysis.plan import Plan, build_plan
from msgen.compiler import analyze_text
from msgen.emit.build import fusion_tables
from tests.emit_fixtures import SPECS, plan


def sketch(counts, pp, chunks=1, split=None, schedule="interleaved") -> Plan:
    """A Plan over just what placement reads: repeats, pp and the pipeline block."""
    ops = [
        SimpleNamespace(kind="repeat", name=f"r{i}", args={"layer": f"l{i}", "count": n})
        for i, n in enumerate(counts)
    ]
    spec = SimpleNamespace(
        mesh=SimpleNamespace(pp=pp),
        pipeline=SimpleNamespace(schedule=schedule, chunks=chunks, split=split),
        network=SimpleNamespace(ops=ops),
    )
    return Plan(spec, None)


def one_by_one(p: Plan) -> list[tuple[int, int]]:
    """(stage, segment) of every layer, by walking the virtual stages layer by layer."""
    out = []
    for segment in range(p.chunks):
        for stage in range(p.stages):
            out += [(stage, segment)] * balanced_split(p.stage_split[stage], p.chunks)[segment]
    assert len(out) == p.total_layers
    return out


def random_plans(n: int, seed: int = 1):
    rng = random.Random(seed)
    for _ in range(n):
        pp, chunks = rng.randint(1, 6), rng.randint(1, 5)
        counts = [rng.randint(1, 12) for _ in range(rng.randint(1, 3))]
        total = sum(counts)
        split = None
        if rng.random() < 0.5 and total >= pp:
            cuts = sorted(rng.sample(range(1, total), pp - 1))
            split = tuple(b - a for a, b in zip([0, *cuts], [*cuts, total], strict=True))
        yield sketch(counts, pp, chunks, split)


def test_placement_is_the_virtual_stage_walk():
    for p in random_plans(2000):
        expected = one_by_one(p)
        assert [p.placement_of(g) for g in range(p.total_layers)] == expected
        for r in p.repeats:
            flat = []
            for first, end, stage, segment in p.placement_runs(r):
                assert first < end
                flat += [(stage, segment)] * (end - first)
            assert flat == expected[r.first : r.first + r.count]
        for stage in range(p.stages):
            want = {}
            for r in p.repeats:
                here = sum(s == stage for s, _ in expected[r.first : r.first + r.count])
                if here:
                    want[r.layer] = here
            assert p.copies_on_stage(stage) == want


@pytest.mark.parametrize("layers, pp, chunks", [(4, 2, 2), (24, 4, 3), (12, 3, 2), (64, 8, 4)])
def test_divisible_layers_take_equal_virtual_stages(layers, pp, chunks):
    """Without split: copy g is virtual stage v = g // (L / (pp * chunks))."""
    p = sketch([layers], pp, chunks)
    k = layers // (pp * chunks)
    assert [p.placement_of(g) for g in range(layers)] == [
        ((g // k) % pp, g // k // pp) for g in range(layers)
    ]


def test_one_chunk_is_the_contiguous_split():
    for schedule in ("1f1b", "gpipe", "interleaved"):
        p = sketch([3, 4], 2, chunks=1 if schedule == "interleaved" else 3, schedule=schedule)
        assert p.chunks == 1 and not p.interleaved
        assert [p.stage_of(g) for g in range(7)] == [0, 0, 0, 0, 1, 1, 1]
        assert p.placement_runs(p.repeats[1]) == ((0, 1, 0, 0), (1, 4, 1, 0))
    assert sketch([8], 1, chunks=2).chunks == 1  # no pipeline, nothing to interleave


def test_a_million_layers_stay_cheap():
    p = sketch([10**6], 8, 4)
    began = time.perf_counter()
    per_stage = [p.copies_on_stage(s) for s in range(8)]
    runs = p.placement_runs(p.repeats[0])
    assert time.perf_counter() - began < 0.05
    assert per_stage == [{"l0": 125_000}] * 8
    assert len(runs) == 32 and runs[0] == (0, 31_250, 0, 0) and runs[8] == (250_000, 281_250, 0, 1)
    assert p.placement_of(999_999) == (7, 3)


def test_the_emitted_fusion_tables_are_the_plan_ids():
    """model.py's COMM_FUSION and LAYER_COMM_FUSION runs, expanded, are plan.json's ids."""
    for name in ("tiny", "tiny_interleaved", "gpt7b"):
        p = plan(name)
        network, layers = fusion_tables(p)
        got = dict(network)
        for layer, names in layers:
            for op_param, runs in names:
                for first, end, fusion_id in runs:
                    for copy in range(first, end):
                        got[f"{layer}.{copy}.{op_param}"] = fusion_id
        # what each path's first matching glob says, copy by copy
        want = {e.path: e.fusion_id for e in p.network_entries() if e.fusion_id != 1}
        for r in p.repeats:
            for op, param in p.layer_params(r.layer):
                for copy in range(r.count):
                    path = f"{r.layer}.{copy}.{op}.{param.name}"
                    fusion_id = p.fusion_id(path, r.first + copy)
                    if fusion_id != 1:
                        want[path] = fusion_id
        assert got == want, name
        # One run per bucket at most (these specs' patterns take whole layers or none).
        buckets = sum(g.buckets for g in p.spec.fusion)
        assert all(len(runs) <= buckets for _, names in layers for _, runs in names), name


# what check says about fusion kinds ---------------------------------------------------


def tiny_with(*edits: tuple[str, str]):
    text = SPECS["tiny"].read_text()
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return analyze_text(text, "tiny.msl", SPECS["tiny"].parent)


GATHER = ('allreduce small   = ["*.ln*", "*.bias"]', 'allgather small   = ["*.ln*", "*.bias"]')
SCATTER = ('allreduce decoder = ["decoder.*"]', 'reducescatter decoder = ["decoder.*"]')


def test_a_non_allreduce_group_is_told_what_it_fuses():
    result = tiny_with(GATHER, SCATTER)  # tiny has zero = 1
    assert result.ok
    found = [d for d in result.diagnostics if d.code == "MSL507"]
    assert [d.severity.value for d in found] == ["warning", "warning"]
    assert "`small` is `allgather`" in found[0].message
    assert "every collective of its parameters" in found[0].message
    assert "not only the ReduceScatter" in found[1].message
    # The ids are the same as with `allreduce`: the kind changes nothing emitted.
    same = build_plan(result.spec, result.facts)
    assert fusion_tables(same) == fusion_tables(plan("tiny"))


def test_without_zero_an_allgather_group_fuses_gradient_allreduces():
    result = tiny_with(GATHER, ("zero         = 1", "zero         = 0"))
    (d,) = [d for d in result.diagnostics if d.code == "MSL507"]
    assert "zero = 0 there is no parallel optimizer" in d.message
    assert "gradient AllReduce" in d.message and d.hint.startswith("write `allreduce small")


def test_allreduce_groups_get_no_kind_warning():
    assert not [d for d in tiny_with().diagnostics if d.code == "MSL507"]
