"""The imports of a generated model.py, as data: each op module declares what its code
and helper cells import (`OpDef.imports`, `setting_imports`), and the module around
them, templates/model.py.j2, declares its own here. Emission merges and sorts the lines
a model needs (msgen/emit/imports.py); the checks reserve every name they can bind.
"""

from __future__ import annotations

from dataclasses import dataclass

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
# model.py's dropout_seeds, when some op drops out (msgen.emit.context, `dropout`)
DROPOUT = ("import itertools", "import mindspore as ms")
# model.py's fused_kernels, when some op has a fused kernel (msgen.emit.context, `fused`)
FUSED = ("import mindspore as ms",)


@dataclass(frozen=True)
class Import:
    """One imported name: `from module import name [as alias]`, or with no name
    `import module [as alias]`."""

    module: str
    name: str | None = None
    alias: str | None = None

    @property
    def bound(self) -> str:
        """The name it binds in the importing module."""
        return self.alias or self.name or self.module.partition(".")[0]


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


def bound(lines) -> frozenset[str]:
    """The names import lines bind."""
    return frozenset(imp.bound for line in lines for imp in parse(line))
