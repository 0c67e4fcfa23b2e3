"""An independent forward pass in numpy, written from msgen's IR (not from the
generated code): the oracle the generated MindSpore model is compared against.

Each op's reference lives beside its tests: a module `tests/test_op_<family>.py`
(named after its module in msgen/ops) maps op kinds to functions of a `Call` in
`REFERENCES`; adding an op is adding its entry there. `repeat` is not an op but the
graph running a layer's graph once per copy, so it stays here.

Dropout is the identity (evaluation). Parameters come in by their spec paths.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import NamedTuple

import numpy as np

from msgen.analysis.plan import Plan
from msgen.ir.models import OpNode
from msgen.ops.base import Context


@dataclass(frozen=True)
class Call:
    """One op as its reference sees it: its node, its operands' values in order, and
    the model's parameters (by path) and dims."""

    node: OpNode
    inputs: list
    params: dict
    prefix: str  # the op's path up to its name: "" or "<layer>.<copy>."
    ctx: Context
    labels: np.ndarray | None  # the network's labels (cross_entropy's targets)

    @property
    def args(self) -> dict:
        return self.node.args

    def param(self, name: str, op: str | None = None) -> np.ndarray:
        """A parameter of this op, or of the op named `op` in the same graph copy."""
        return self.params[f"{self.prefix}{op or self.node.name}.{name}"]


class WithAux(NamedTuple):
    """An op's output and the auxiliary loss it adds to the network's loss (moe's
    load-balancing and z-losses)."""

    value: np.ndarray
    aux: float


Reference = Callable[[Call], np.ndarray | WithAux]


@cache
def references() -> dict[str, Reference]:
    """Every op's reference, from the `REFERENCES` of tests/test_op_*.py."""
    found: dict[str, Reference] = {}
    for path in sorted(Path(__file__).parent.glob("test_op_*.py")):
        module = importlib.import_module(f"tests.{path.stem}")
        for kind, function in module.REFERENCES.items():
            assert kind not in found, f"{kind} has two references ({path.name})"
            found[kind] = function
    return found


def run_graph(plan: Plan, graph: str, x, params: dict, prefix: str, labels, ctx, aux: list):
    """The graph's output; the auxiliary losses of its ops are appended to `aux`."""
    facts = plan.graph(graph)
    values = {facts.graph.input.name: x}
    for name, of in facts.ops.items():
        node = of.node
        ins = [values[r.name] for r in node.inputs]
        if node.kind == "repeat":
            layer, out = node.args["layer"], ins[0]
            for i in range(node.args["count"]):
                out = run_graph(plan, layer, out, params, f"{layer}.{i}.", None, ctx, aux)
        else:
            out = references()[node.kind](Call(node, ins, params, prefix, ctx, labels))
            if isinstance(out, WithAux):
                out, loss = out
                aux.append(loss)
        values[name] = out
    return values[facts.graph.output]


def forward_loss(plan: Plan, params: dict, tokens, labels) -> float:
    """The network's loss on `tokens` [batch, seq] against `labels`, in float64, plus
    its ops' auxiliary losses."""
    from msgen.analysis.facts import context

    params = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
    aux: list[float] = []
    loss = run_graph(plan, "network", tokens, params, "", labels, context(plan.spec), aux)
    return float(loss) + sum(aux)
