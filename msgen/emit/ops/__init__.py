"""The MindSpore backend's per-op emission, by op kind (msgen/emit/ops/base.py
`OpEmitter`): every public `OpEmitter` subclass with a `kind` in a module of this
package, as msgen.ops finds the ops. Every op of the library has one."""

from __future__ import annotations

import importlib
import pkgutil

from msgen.emit.ops.base import OpEmitter, Snippet, call_args, strategy_keywords


def _discover() -> dict[str, OpEmitter]:
    found: dict[str, OpEmitter] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, OpEmitter)
                and value.__module__ == module.__name__
                and "kind" in vars(value)
            ):
                found[value.kind] = value()
    return found


EMITTERS: dict[str, OpEmitter] = _discover()

__all__ = ["EMITTERS", "OpEmitter", "Snippet", "call_args", "strategy_keywords"]
