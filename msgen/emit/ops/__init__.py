"""The MindSpore backend's per-op emission, by op kind (msgen/emit/ops/base.py
`OpEmitter`): every public `OpEmitter` subclass with a `kind` in a module of this
package, as msgen.ops finds the ops. Every op of the library has one."""

from __future__ import annotations

from msgen.base.registry import discover
from msgen.emit.ops.base import OpEmitter, Snippet, call_args, strategy_keywords

EMITTERS: dict[str, OpEmitter] = discover(__name__, __path__, OpEmitter, "kind")

__all__ = ["EMITTERS", "OpEmitter", "Snippet", "call_args", "strategy_keywords"]
