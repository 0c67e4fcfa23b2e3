"""The Plan: a checked spec plus what the estimate and the emitters share —
pipeline stages, parameter paths, fusion ids — computed without expanding
repeats (a 10^6-layer spec costs what a 32-layer one does, until code is emitted).
"""

from __future__ import annotations

import fnmatch
from bisect import bisect_right
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate
from math import prod

from msgen.checks.facts import Facts, GraphFacts
from msgen.ir.models import FusionGroup, OpNode, Spec
from msgen.ops.base import Param

DEFAULT_FUSION_ID = 1  # MindSpore's default group keeps what no fusion group takes


@dataclass(frozen=True)
class ParamEntry:
    path: str  # decoder.3.qkv.weight, emb.table
    graph: str  # the layer's name, or "network"
    op: str
    copy: int | None  # index of the repeated copy, None for network params
    param: Param
    stages: tuple[int, ...]
    fusion_id: int


@dataclass(frozen=True)
class Repeat:
    layer: str
    op: str  # the network op that repeats it
    count: int
    first: int  # global index of its first copy in the stack of repeated layers


def balanced_split(layers: int, stages: int) -> tuple[int, ...]:
    """Layers per stage; the first (layers mod stages) stages take one more."""
    base, extra = divmod(layers, stages)
    return tuple(base + (1 if s < extra else 0) for s in range(stages))


def bucket_sizes(layers: int, buckets: int) -> tuple[int, ...]:
    return balanced_split(layers, buckets)


@dataclass
class Plan:
    spec: Spec
    facts: Facts

    # pipeline -----------------------------------------------------------------

    @cached_property
    def repeats(self) -> tuple[Repeat, ...]:
        out, first = [], 0
        for node in self.spec.network.ops:
            if node.kind == "repeat":
                count = node.args["count"]
                out.append(Repeat(node.args["layer"], node.name, count, first))
                first += count
        return tuple(out)

    @property
    def stages(self) -> int:
        return self.spec.mesh.pp

    @property
    def total_layers(self) -> int:
        return sum(r.count for r in self.repeats)

    @cached_property
    def stage_split(self) -> tuple[int, ...]:
        split = self.spec.pipeline.split
        if split and len(split) == self.stages and sum(split) == self.total_layers:
            return tuple(split)
        return balanced_split(self.total_layers, self.stages)

    @cached_property
    def _stage_starts(self) -> list[int]:
        return list(accumulate(self.stage_split))[:-1]

    def stage_of(self, global_index: int) -> int:
        return bisect_right(self._stage_starts, global_index)

    def copy_stage(self, layer: str, index: int) -> int:
        rep = next(r for r in self.repeats if r.layer == layer)
        return self.stage_of(rep.first + index)

    def copies_on_stage(self, stage: int) -> dict[str, int]:
        """How many copies of each repeated layer run on `stage`."""
        lo = sum(self.stage_split[:stage])
        hi = lo + self.stage_split[stage]
        out = {}
        for r in self.repeats:
            n = max(0, min(hi, r.first + r.count) - max(lo, r.first))
            if n:
                out[r.layer] = n
        return out

    def network_op_stage(self, node: OpNode) -> int:
        """Ops before the first repeat run on the first stage; any later op on the
        stage of the last copy repeated before it."""
        stage = 0
        for op in self.spec.network.ops:
            if op.kind == "repeat":
                rep = next(r for r in self.repeats if r.op == op.name)
                stage = self.stage_of(rep.first + rep.count - 1)
            if op.name == node.name:
                return stage
        return stage

    def network_param_stages(self, op: str) -> tuple[int, ...]:
        """Stages holding a network op's parameters: its own, plus the stages of
        output layers tied to it."""
        nodes = {n.name: n for n in self.spec.network.ops}
        stages = {self.network_op_stage(nodes[op])}
        for n in self.spec.network.ops:
            if n.args.get("tie") == op:
                stages.add(self.network_op_stage(n))
        return tuple(sorted(stages))

    # parameters ---------------------------------------------------------------

    def graph(self, name: str) -> GraphFacts:
        return self.facts.graphs[name]

    def layer_params(self, layer: str) -> list[tuple[str, Param]]:
        """(op, param) of one copy of a layer, in op order."""
        return [(op, p) for op, of in self.graph(layer).ops.items() for p in of.params]

    def network_params(self) -> list[tuple[str, Param]]:
        return [
            (op, p)
            for op, of in self.graph("network").ops.items()
            if of.node.kind != "repeat"
            for p in of.params
        ]

    @cached_property
    def params_total(self) -> int:
        """Logical parameters, each once (a tied table once)."""
        total = sum(prod(p.shape) for _, p in self.network_params())
        for r in self.repeats:
            total += r.count * sum(prod(p.shape) for _, p in self.layer_params(r.layer))
        return total

    def param_entries(self):
        """Every parameter by path, copies expanded: for plan.json and the emitters."""
        for op, p in self.network_params():
            path = f"{op}.{p.name}"
            yield ParamEntry(
                path, "network", op, None, p, self.network_param_stages(op), self.fusion_id(path)
            )
        for r in self.repeats:
            params = self.layer_params(r.layer)
            for i in range(r.count):
                stage = (self.stage_of(r.first + i),)
                for op, p in params:
                    path = f"{r.layer}.{i}.{op}.{p.name}"
                    fusion = self.fusion_id(path, r.first + i)
                    yield ParamEntry(path, r.layer, op, i, p, stage, fusion)

    # fusion -------------------------------------------------------------------

    @cached_property
    def fusion_ids(self) -> dict[str, tuple[int, ...]]:
        """Each group's ids: 2, 3, ... in declaration order; `buckets N` takes N."""
        out, next_id = {}, DEFAULT_FUSION_ID + 1
        for g in self.spec.fusion:
            out[g.name] = tuple(range(next_id, next_id + g.buckets))
            next_id += g.buckets
        return out

    def fusion_group(self, path: str) -> FusionGroup | None:
        return next(
            (g for g in self.spec.fusion if any(fnmatch.fnmatchcase(path, p) for p in g.patterns)),
            None,
        )

    def fusion_id(self, path: str, layer_index: int | None = None) -> int:
        """`layer_index` counts repeated layers across all repeats, from 0."""
        group = self.fusion_group(path)
        if group is None:
            return DEFAULT_FUSION_ID
        ids = self.fusion_ids[group.name]
        if layer_index is None or group.buckets == 1:
            return ids[0]
        ends = list(accumulate(bucket_sizes(self.total_layers, group.buckets)))
        return ids[bisect_right(ends[:-1], layer_index)]


def build_plan(spec: Spec, facts: Facts) -> Plan:
    return Plan(spec, facts)
