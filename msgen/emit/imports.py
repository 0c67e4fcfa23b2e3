"""The import block of a generated model.py: what its ops' code and helper cells import
(each op module's `imports_of`) and what the module around them needs, merged and
sorted as isort and ruff's `I` rules sort them: the standard library first, a blank line,
then the rest; within each, `import x` lines before `from x import ...` lines, each by
module; a line's names constants first, then classes, then the rest.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from msgen.emit.context import ModelContext
from msgen.ops import OPS

# What templates/model.py.j2 uses around the ops: parameters, their initialisers, the
# dtypes, nn.Cell.
SHELL = (
    "from mindspore import Parameter, nn",
    "from mindspore.common import dtype as mstype",
    "from mindspore.common.initializer import Normal, initializer",
)
# lazy_inline_on_ascend, in model.py when the network is lazy-inlined
LAZY_INLINE = (
    "from functools import wraps",
    "import mindspore as ms",
    "from mindspore import lazy_inline",
    "from mindspore.communication import GlobalComm",
)


@dataclass(frozen=True)
class Import:
    """One imported name: `from module import name [as alias]`, or with no name
    `import module [as alias]`."""

    module: str
    name: str | None = None
    alias: str | None = None


def _dotted(text: str, line: str) -> str:
    if not all(part.isidentifier() for part in text.split(".")):
        raise ValueError(f"not an import line: {line!r}")
    return text


def _named(text: str, line: str) -> tuple[str, str | None]:
    name, _, alias = (part.strip() for part in text.partition(" as "))
    return _dotted(name, line), _dotted(alias, line) if alias else None


def parse(line: str) -> tuple[Import, ...]:
    """`import m [as a]` or `from m import n [as a], ...`, as written in Python."""
    if line.startswith("import "):
        module, alias = _named(line.removeprefix("import "), line)
        return (Import(module, None, alias),)
    head, _, names = line.partition(" import ")
    if not head.startswith("from ") or not names:
        raise ValueError(f"not an import line: {line!r}")
    module = _dotted(head.removeprefix("from ").strip(), line)
    return tuple(Import(module, *_named(name, line)) for name in names.split(","))


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
        names = sorted(by_module[module], key=_member_order)
        lines.append(f"from {module} import {', '.join(_spelled(i.name, i.alias) for i in names)}")
    return lines


def block(lines: tuple[str, ...] | list[str]) -> str:
    """Import lines merged into one sorted block."""
    imports = {imp for line in lines for imp in parse(line)}
    stdlib = [i for i in imports if i.module.partition(".")[0] in sys.stdlib_module_names]
    rest = [i for i in imports if i not in stdlib]
    return "\n\n".join("\n".join(_section(part)) for part in (stdlib, rest) if part)


def model_imports(ctx: ModelContext) -> str:
    """The import block of model.py: the shell's, and the union over the ops it emits."""
    lines = [*SHELL, *(LAZY_INLINE if ctx.lazy_inline else ())]
    lines += [line for op in ctx.ops() for line in OPS[op.kind].imports_of(op)]
    return block(lines)
