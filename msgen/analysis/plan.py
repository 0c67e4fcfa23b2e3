"""The Plan: a checked spec plus what the estimate and the emitters share —
pipeline stages (msgen/analysis/placement.py), parameter paths, fusion ids — computed
without expanding repeats (a 10^6-layer spec costs what a 32-layer one does, until
code is emitted).
"""

from __future__ import annotations

import dataclasses
import fnmatch
from bisect import bisect_right
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate
from math import prod

from msgen.analysis.facts import Facts, GraphFacts
from msgen.analysis.globs import glob_runs
from msgen.analysis.mtp import PREFIX as MTP_PREFIX
from msgen.analysis.mtp import Module, module
from msgen.analysis.placement import Placement, Repeat, balanced_split
from msgen.ir.models import FusionGroup, OpNode, Spec
from msgen.ops import OPS
from msgen.ops.base import Param

DEFAULT_FUSION_ID = 1  # MindSpore's default group keeps what no fusion group takes


@dataclass(frozen=True)
class ParamEntry:
    """A network parameter (repeated layers' are ParamRuns)."""

    path: str  # emb.table
    op: str
    param: Param
    stages: tuple[int, ...]
    fusion_id: int


@dataclass(frozen=True)
class ParamRun:
    """One parameter of a repeated layer over copies first .. end - 1, which share a
    stage and a fusion id."""

    layer: str
    op: str
    param: Param
    first: int
    end: int
    stage: int
    fusion_id: int

    @property
    def name(self) -> str:
        return f"{self.op}.{self.param.name}"

    def path(self, copy: int) -> str:
        return f"{self.layer}.{copy}.{self.name}"


@dataclass
class Plan(Placement):
    """A checked spec with what the estimate and the emitters derive from it once: its
    pipeline placement (Placement), and its parameters, buffers and fusion ids."""

    facts: Facts

    # parameters ---------------------------------------------------------------

    def graph(self, name: str) -> GraphFacts:
        return self.facts.graphs[name]

    def layer_params(self, layer: str) -> list[tuple[str, Param]]:
        """(op, param) of one copy of a layer, in op order."""
        return [(op, p) for op, of in self.graph(layer).ops.items() for p in of.params]

    def network_params(self) -> list[tuple[str, Param]]:
        """The network ops' parameters, then the multi-token prediction modules'."""
        own = [
            (op, p)
            for op, of in self.graph("network").ops.items()
            if of.node.kind != "repeat"
            for p in of.params
        ]
        return own + self.mtp_params()

    # multi-token prediction -----------------------------------------------------

    @cached_property
    def mtp(self) -> Module | None:
        """The multi-token prediction module (`train.mtp`), None without one."""
        return module(self.spec, self.facts)

    def mtp_params(self) -> list[tuple[str, Param]]:
        """(op path, param) of every module's own parameters, module by module."""
        if self.mtp is None:
            return []
        first = self.mtp.own_params(self.facts)
        zero = f"{MTP_PREFIX}.0."
        return [
            (f"{MTP_PREFIX}.{k}.{op.removeprefix(zero)}", p)
            for k in range(self.mtp.setting.depth)
            for op, p in first
        ]

    @cached_property
    def params_mtp(self) -> int:
        """The modules' own parameters (inside params_total; the shared embedding
        table and output layer are the main model's)."""
        return sum(prod(p.shape) for _, p in self.mtp_params())

    @cached_property
    def params_total(self) -> int:
        """Logical parameters, each once (a tied table once)."""
        total = sum(prod(p.shape) for _, p in self.network_params())
        for r in self.repeats:
            total += r.count * sum(prod(p.shape) for _, p in self.layer_params(r.layer))
        return total

    @cached_property
    def params_active(self) -> int:
        """Parameters one token's forward reads: all of them but the experts a mixture
        of experts does not route it to (`OpDef.active_params`)."""

        def active(graph: str) -> int:
            ops = self.graph(graph).ops.values()
            return sum(OPS[of.node.kind].active_params(of.node, of.params) for of in ops
                       if of.node.kind != "repeat")  # fmt: skip

        total = active("network") + sum(r.count * active(r.layer) for r in self.repeats)
        if self.mtp is not None:  # a module reads its own weights and its block's active ones
            mod = self.mtp
            own = sum(prod(p.shape) for of in (mod.enorm, mod.hnorm, mod.eh_proj, mod.norm)
                      for p in of.params)  # fmt: skip
            total += mod.setting.depth * (own + active(mod.setting.layer))
        return total

    def network_entries(self) -> list[ParamEntry]:
        """The network's parameters by path (a repeat's are its layer's runs)."""
        return [
            ParamEntry(
                f"{op}.{p.name}",
                op,
                p,
                self.network_param_stages(op),
                self.fusion_id(f"{op}.{p.name}"),
            )
            for op, p in self.network_params()
        ]

    def layer_runs(self, rep: Repeat) -> list[ParamRun]:
        """Each parameter of a repeated layer as runs of copies that share a stage and
        a fusion id: their number follows the stages, the fusion buckets and the
        fusion globs, never the copies (msgen/globs.py)."""
        out = []
        placement = [(first, end, stage) for first, end, stage, _ in self.placement_runs(rep)]
        groups = [g.patterns for g in self.spec.fusion]
        for op, p in self.layer_params(rep.layer):
            found = glob_runs(groups, f"{rep.layer}.", f".{op}.{p.name}", rep.count)
            cuts = {first for first, _, _ in placement} | {first for first, _, _ in found}
            for g, group in enumerate(self.spec.fusion):
                if group.buckets > 1 and any(gi == g for _, _, gi in found):
                    cuts |= {end - rep.first for end in self._bucket_ends(group.buckets)}
            edges = sorted(c for c in cuts | {rep.count} if 0 <= c <= rep.count)
            runs: list[ParamRun] = []
            for first, end in zip(edges, edges[1:]):
                stage = next(s for f, e, s in placement if f <= first < e)
                gi = next(gi for f, e, gi in found if f <= first < e)
                fusion = self._group_id(None if gi is None else self.spec.fusion[gi],
                                        rep.first + first)  # fmt: skip
                if runs and (runs[-1].stage, runs[-1].fusion_id) == (stage, fusion):
                    runs[-1] = dataclasses.replace(runs[-1], end=end)
                else:
                    runs.append(ParamRun(rep.layer, op, p, first, end, stage, fusion))
            out.extend(runs)
        return out

    # buffers ------------------------------------------------------------------

    def op_buffers(self, graph: str) -> list[tuple[OpNode, str, tuple[int, ...]]]:
        """(op, buffer, shape) of one copy of a graph's ops (`OpDef.buffers`)."""
        return [
            (of.node, name, shape)
            for of in self.graph(graph).ops.values()
            if of.node.kind != "repeat"
            for name, shape in OPS[of.node.kind].buffers(of.node).items()
        ]

    def buffers(self) -> dict[str, tuple[int, ...]]:
        """Every buffer by path, with its shape: state that is not a parameter (no
        gradient, no optimizer state, not in params_total) and that checkpoints carry
        whole, as moe's correction bias."""
        out = {f"{node.name}.{name}": shape for node, name, shape in self.op_buffers("network")}
        for rep in self.repeats:
            for node, name, shape in self.op_buffers(rep.layer):
                out |= {f"{rep.layer}.{c}.{node.name}.{name}": shape for c in range(rep.count)}
        if self.mtp is not None:  # each module's block: a copy of its layer's
            for node, name, shape in self.op_buffers(self.mtp.setting.layer):
                depth = range(self.mtp.setting.depth)
                out |= {f"{MTP_PREFIX}.{k}.block.{node.name}.{name}": shape for k in depth}
        return out

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
        return self._group_id(self.fusion_group(path), layer_index)

    def _bucket_ends(self, buckets: int) -> list[int]:
        """Where each of `buckets` ranges of the repeated layers ends (global index)."""
        return list(accumulate(balanced_split(self.total_layers, buckets)))

    def _group_id(self, group: FusionGroup | None, layer_index: int | None) -> int:
        if group is None:
            return DEFAULT_FUSION_ID
        ids = self.fusion_ids[group.name]
        if layer_index is None or group.buckets == 1:
            return ids[0]
        return ids[bisect_right(self._bucket_ends(group.buckets)[:-1], layer_index)]


def build_plan(spec: Spec, facts: Facts) -> Plan:
    return Plan(spec, facts)
