"""The import block of a generated model.py: what its ops' code and helper cells import
and what the module around them needs (msgen/ops/imports.py), merged and sorted as
isort and ruff's `I` rules sort them: the standard library first, a blank line, then
the rest; within each, `import x` lines before `from x import ...` lines, each by
module; a line's names constants first, then classes, then the rest.
"""

from __future__ import annotations

import sys

from msgen.emit.context import ModelContext
from msgen.emit.layout import LINE_LENGTH
from msgen.ops import OPS
from msgen.ops.imports import DROPOUT, FUSED, LAZY_INLINE, SHELL, Import, parse


def _member_order(imp: Import) -> tuple[int, str, str, str]:
    name = imp.name or ""
    kind = 0 if name.isupper() and len(name) > 1 else 1 if name[:1].isupper() else 2
    return kind, name.lower(), name, imp.alias or ""


def _spelled(name: str, alias: str | None) -> str:
    return f"{name} as {alias}" if alias else name


def _section(imports: list[Import]) -> list[str]:
    plain = sorted((i for i in imports if i.name is None), key=lambda i: (i.module, i.alias or ""))
    lines = [f"import {_spelled(i.module, i.alias)}" for i in plain]
    by_module: dict[str, list[Import]] = {}
    for imp in imports:
        if imp.name is not None:
            by_module.setdefault(imp.module, []).append(imp)
    for module in sorted(by_module, key=str.lower):
        names = [_spelled(i.name, i.alias) for i in sorted(by_module[module], key=_member_order)]
        line = f"from {module} import {', '.join(names)}"
        if len(line) > LINE_LENGTH:  # black's form: one name a line, a trailing comma
            line = "\n".join([f"from {module} import (", *(f"    {n}," for n in names), ")"])
        lines.append(line)
    return lines


def block(lines: tuple[str, ...] | list[str]) -> str:
    """Import lines merged into one sorted block."""
    imports = {imp for line in lines for imp in parse(line)}
    stdlib = [i for i in imports if i.module.partition(".")[0] in sys.stdlib_module_names]
    rest = [i for i in imports if i not in stdlib]
    return "\n\n".join("\n".join(_section(part)) for part in (stdlib, rest) if part)


def model_imports(ctx: ModelContext) -> str:
    """The import block of model.py: the shell's, and the union over the ops it emits."""
    lines = [*SHELL, *(LAZY_INLINE if ctx.lazy_inline else ()), *(DROPOUT if ctx.dropout else ())]
    lines += FUSED if ctx.fused else ()
    lines += [line for op in ctx.ops() for line in OPS[op.kind].imports_of(op)]
    if ctx.mtp is not None:
        from msgen.emit.mtp import IMPORTS

        lines += IMPORTS
    return block(lines)
