"""What the MindSpore backend emits per op kind: an `OpEmitter` subclass per op, found
by the registry (msgen/emit/ops/__init__.py) in this package's modules.

The op library (msgen/ops) keeps what every backend shares: an op's arguments,
shapes, parameters, layout, strategies, saved tensors, work and recompute rule. An
emitter says how today's backend writes it: the settings its code needs
(`settings`), the code itself (`code`, a `Snippet`), the helper cells it instantiates
(`helpers`, each a fragment `templates/ops/<helper>.py.j2`) and the values those
fragments are rendered with (`helper_values`). A second backend registers its own
emitters beside its own templates and reads the same op library.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from msgen.ops import OPS
from msgen.ops.base import OpDef


@dataclass(frozen=True)
class Snippet:
    """An op in a generated cell: `self.<op> = make` in `__init__`, `<op> = call` in
    `construct`; `helper` names the helper cell `make` instantiates, if any; `aux`:
    the call returns (output, an auxiliary loss the network adds to its loss)."""

    make: str
    call: str
    helper: str | None = None
    aux: bool = False


def call_args(*values: str | float) -> str:
    """Arguments of a generated call: tensor names as they are, numbers as literals."""
    return ", ".join(v if isinstance(v, str) else repr(v) for v in values)


def strategy_keywords(op, roles: Iterable[str]) -> str:
    """`, <role>=<strategy>` for each of `roles`, in their order: the strategies a helper
    cell takes as keyword arguments (`op` is the emitter's record, msgen.emit.context
    `OpSpec`)."""
    return "".join(f", {role}={op.strategy(role)}" for role in roles)


class OpEmitter:
    kind: ClassVar[str]  # the op's name in the library (msgen.ops.OPS)
    # Helper cells its code may instantiate: templates/ops/<helper>.py.j2 each.
    helpers: ClassVar[tuple[str, ...]] = ()

    @property
    def op(self) -> OpDef:
        return OPS[self.kind]

    def arg(self, node, name: str):
        """An argument as written, else its declared default (the op's `arg`)."""
        return self.op.arg(node, name)

    def settings(self, node, ctx) -> dict:
        """What `code` needs beyond the op's inputs, parameters and strategies."""
        return {}

    def code(self, op, model) -> Snippet:
        """The op's generated code. `op` is the emitter's record of it (name, inputs,
        params, `strategy(role)`, `setting(key)`), `model` the model's (seq, network)."""
        raise NotImplementedError

    def helper_values(self, ops) -> dict:
        """What the op's helper-cell fragments (templates/ops/) are rendered with, given
        the emitter's records of every op of this kind in the model."""
        return {}
