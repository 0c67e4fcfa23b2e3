"""The op library: one class per op, looked up by the name a spec calls it by.

Every public `OpDef` subclass with a `name` in a module of this package is an op,
in the order of the modules' names and, within a module, of definition: adding an
op is adding its module (or a class to a module of its family) and its emitter
(msgen/emit/ops, which the backend's registry finds the same way).
"""

from __future__ import annotations

from msgen.base.registry import discover
from msgen.ops.base import OpDef
from msgen.ops.imports import DROPOUT, FUSED, LAZY_INLINE, SHELL, bound

OPS: dict[str, OpDef] = discover(__name__, __path__, OpDef, "name")

# Written as operators, not called by name.
OPERATORS = {"+": "add", "*": "mul"}
CALLABLE = sorted(name for name in OPS if name not in OPERATORS.values())


def imported_names() -> frozenset[str]:
    """Every name a generated model.py may import: its shell's, and each op's under
    any settings."""
    return bound(
        [
            *SHELL,
            *LAZY_INLINE,
            *DROPOUT,
            *FUSED,
            *(line for op in OPS.values() for line in op.imports_of()),
        ]
    )


__all__ = ["OPS", "OPERATORS", "CALLABLE", "OpDef", "imported_names"]
