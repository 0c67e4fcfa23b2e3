"""Where a spec's layers run: the pipeline stages and model chunks (virtual stages)
of every repeated layer and network op, computed without expanding repeats (a
10^6-layer spec costs what a 32-layer one does). The Plan (msgen/analysis/plan.py)
is a Placement with the parameters, buffers and fusion ids besides.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate

from msgen.analysis.mtp import PREFIX as MTP_PREFIX
from msgen.ir.models import OpNode, Spec
from msgen.ir.schema import Schedule
from msgen.ops import OPS


def balanced_split(layers: int, stages: int) -> tuple[int, ...]:
    """Layers per stage, balanced: the first (layers mod stages) take one more."""
    base, extra = divmod(layers, stages)
    return tuple(base + (1 if s < extra else 0) for s in range(stages))


@dataclass(frozen=True)
class Repeat:
    """A repeated layer: how many copies, from which index of the layer stack."""

    layer: str
    op: str  # the network op that repeats it
    count: int
    first: int  # global index of its first copy in the stack of repeated layers


@dataclass
class Placement:
    """A checked spec's pipeline placement."""

    spec: Spec

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
        """Repeated layers per pipeline stage: `split`, else balanced."""
        split = self.spec.pipeline.split
        if split and len(split) == self.stages and sum(split) == self.total_layers:
            return tuple(split)
        return balanced_split(self.total_layers, self.stages)

    @property
    def chunks(self) -> int:
        """Model chunks (virtual stages, MindSpore's pipeline segments) per stage:
        N for `interleaved(chunks = N)` over pp > 1 stages, else 1."""
        pipe = self.spec.pipeline
        if self.stages > 1 and pipe.schedule == Schedule.INTERLEAVED:
            return max(1, pipe.chunks)
        return 1

    @property
    def interleaved(self) -> bool:
        return self.chunks > 1

    # Where each repeated layer runs. The layers (global index g over every repeat,
    # in network order) run through virtual stages v = 0 .. pp * chunks - 1, in
    # order; virtual stage v is stage v % pp, segment v // pp. Stage s holds
    # stage_split[s] layers, split over its chunks by the balanced rule (segment c
    # takes one more while c < stage_split[s] mod chunks). Without `split` and with
    # the layers divisible by pp * chunks (MSL315 checks it) that is every virtual
    # stage L / (pp * chunks) layers: v = g // (L / (pp * chunks)). With an explicit
    # `split` each stage keeps its count, and each count must be at least chunks
    # (MSL315), so that no virtual stage is empty. With one chunk it is the plain
    # contiguous split. Lookups cost O(pp log chunks), never O(layers).

    @cached_property
    def _stage_starts(self) -> list[int]:
        return list(accumulate(self.stage_split))[:-1]

    @cached_property
    def _chunk_split(self) -> tuple[tuple[int, int], ...]:
        """Per stage (base, extra): its segment c holds base + (c < extra) layers."""
        return tuple(divmod(n, self.chunks) for n in self.stage_split)

    def _chunk_size(self, stage: int, segment: int) -> int:
        base, extra = self._chunk_split[stage]
        return base + (segment < extra)

    def _segment_start(self, segment: int) -> int:
        """Global index of the first layer of `segment` (of its chunk on stage 0)."""
        return sum(segment * base + min(segment, extra) for base, extra in self._chunk_split)

    def _segment_at(self, g: int) -> int:
        """The segment holding global layer g: the first whose successor starts after g."""
        lo, hi = 0, self.chunks - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self._segment_start(mid + 1) > g:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def placement_of(self, global_index: int) -> tuple[int, int]:
        """(stage, segment) of the repeated layer with this global index."""
        if self.chunks == 1:
            return bisect_right(self._stage_starts, global_index), 0
        segment = self._segment_at(global_index)
        offset = global_index - self._segment_start(segment)
        for stage in range(self.stages):
            size = self._chunk_size(stage, segment)
            if offset < size:
                return stage, segment
            offset -= size
        return self.stages - 1, segment

    def stage_of(self, global_index: int) -> int:
        return self.placement_of(global_index)[0]

    def segment_of(self, global_index: int) -> int:
        return self.placement_of(global_index)[1]

    def copy_stage(self, layer: str, index: int) -> int:
        rep = next(r for r in self.repeats if r.layer == layer)
        return self.stage_of(rep.first + index)

    def _virtual_stages_from(self, g: int):
        """(start, end, stage, segment) of the non-empty virtual stages from the one
        holding global layer g on, in order."""
        segment = self._segment_at(g) if self.chunks > 1 else 0
        start = self._segment_start(segment)
        for c in range(segment, self.chunks):
            for stage in range(self.stages):
                size = self._chunk_size(stage, c)
                if size and start + size > g:
                    yield start, start + size, stage, c
                start += size

    def placement_runs(self, rep: Repeat) -> tuple[tuple[int, int, int, int], ...]:
        """(first copy, end copy, stage, segment) runs covering the copies of `rep`:
        one per virtual stage it spans, so their number does not grow with the layers."""
        lo, hi = rep.first, rep.first + rep.count
        out = []
        for start, end, stage, segment in self._virtual_stages_from(lo):
            if start >= hi:
                break
            out.append((max(start, lo) - lo, min(end, hi) - lo, stage, segment))
        return tuple(out)

    def _on_stage_before(self, x: int, stage: int) -> int:
        """How many of the global layers [0, x) run on `stage`."""
        if x <= 0:
            return 0
        if x >= self.total_layers:
            return self.stage_split[stage]
        segment = self._segment_at(x) if self.chunks > 1 else 0
        base, extra = self._chunk_split[stage]
        before = segment * base + min(segment, extra)  # its chunks of earlier segments
        start = self._segment_start(segment)
        start += sum(self._chunk_size(s, segment) for s in range(stage))
        return before + min(max(x - start, 0), self._chunk_size(stage, segment))

    def copies_on_stage(self, stage: int) -> dict[str, int]:
        """How many copies of each repeated layer run on `stage`."""
        out = {}
        for r in self.repeats:
            n = self._on_stage_before(r.first + r.count, stage) - self._on_stage_before(
                r.first, stage
            )
            if n:
                out[r.layer] = n
        return out

    def network_op_placement(self, node: OpNode) -> tuple[int, int]:
        """(stage, segment) of a network op: ops before the first repeat run on the
        first stage, segment 0; any later op where the last copy repeated before it runs."""
        placement = (0, 0)
        for op in self.spec.network.ops:
            if op.kind == "repeat":
                rep = next(r for r in self.repeats if r.op == op.name)
                if rep.count:
                    placement = self.placement_of(rep.first + rep.count - 1)
            if op.name == node.name:
                return placement
        return placement

    def network_op_stage(self, node: OpNode) -> int:
        return self.network_op_placement(node)[0]

    def network_op_segment(self, node: OpNode) -> int:
        return self.network_op_placement(node)[1]

    def network_param_stages(self, op: str) -> tuple[int, ...]:
        """Stages holding a network op's parameters: its own, plus the stages of
        output layers tied to it; multi-token prediction's run on the last stage, with
        the output layer (as mindformers places its MultiTokenPredictionBlock)."""
        if op.startswith(MTP_PREFIX + "."):
            return (self.stages - 1,)
        nodes = {n.name: n for n in self.spec.network.ops}
        stages = {self.network_op_stage(nodes[op])}
        for n in self.spec.network.ops:
            if n.kind in OPS and op in OPS[n.kind].shared_from(n.args).values():
                stages.add(self.network_op_stage(n))
        return tuple(sorted(stages))
