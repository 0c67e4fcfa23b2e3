"""What the check passes learn about a spec's graphs, in the order they learn it:
the names pass orders the graphs, shapes fills in shapes, sharding the layouts."""

from __future__ import annotations

from dataclasses import dataclass, field

from msgen.diagnostics import Span
from msgen.ir.models import Graph, OpNode, Spec
from msgen.ir.schema import DTYPE_BYTES
from msgen.ops.base import Context, Layout, Param, Saved, Tensor

TOKEN_BYTES = 4  # token ids are int32


@dataclass
class Redistribution:
    """An implicit redistribution in front of an op input (per micro-batch)."""

    op: str
    operand: str
    produced: tuple
    needed: tuple
    bytes_per_device: int
    span: Span
    times: int = 1  # per run of the op; between chained copies, count - 1


@dataclass
class OpFacts:
    """What the analysis derived for one op: its tensors, layout and saved tensors."""

    node: OpNode
    output: Tensor | None = None
    inputs: list[Tensor] = field(default_factory=list)  # as their producers give them
    layout: Layout | None = None
    redistributions: list[Redistribution] = field(default_factory=list)
    saves: list[Saved] = field(default_factory=list)

    @property
    def params(self) -> tuple[Param, ...]:
        return self.layout.params if self.layout else ()


@dataclass
class GraphFacts:
    """What the analysis derived for one layer or the network, by tensor and op."""

    graph: Graph
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    tensors: dict[str, Tensor] = field(default_factory=dict)
    ops: dict[str, OpFacts] = field(default_factory=dict)

    @property
    def output(self) -> Tensor | None:
        return self.tensors.get(self.graph.output or "")


@dataclass
class Facts:
    """The analysis of a spec: each graph's facts (the layers first, then the network)."""

    order: list[str] = field(default_factory=list)  # layers first (as repeated), then network
    graphs: dict[str, GraphFacts] = field(default_factory=dict)
    repeats: dict[str, OpNode] = field(default_factory=dict)  # layer -> the repeat using it


def context(spec: Spec, tied: dict[str, Param] | None = None) -> Context:
    mesh = spec.mesh
    return Context(
        mesh_sizes={"dp": mesh.dp, "tp": mesh.tp, "pp": mesh.pp, "ep": mesh.ep},
        dims=dict(spec.model.dims),
        dtype_bytes=DTYPE_BYTES[spec.model.dtype],
        tied=tied if tied is not None else {},
        semi_auto=spec.semi_auto,
    )


def graph_of(spec: Spec, name: str) -> Graph:
    return spec.network if name == "network" else spec.layers[name]
