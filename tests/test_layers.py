"""The package's layers, bottom to top: a module imports only from its own layer or
the layers below, and no two modules import each other, directly or round a
loop. Every import counts: at the top of a module, inside a function, and under
`if TYPE_CHECKING:`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "msgen"

# The pipeline, bottom to top (shared/DESIGN.md "The pipeline").
LAYERS = (
    (
        "diagnostics",
        ("msgen", "msgen.diagnostics", "msgen.codes", "msgen.resources", "msgen.hostinfo"),
    ),
    ("base", ("msgen.base",)),
    ("syntax", ("msgen.syntax",)),
    ("ir", ("msgen.ir",)),
    ("ops", ("msgen.ops",)),
    ("lowering", ("msgen.lowering",)),
    ("analysis", ("msgen.analysis",)),
    ("checks", ("msgen.checks",)),
    ("estimate", ("msgen.estimate",)),
    ("compiler", ("msgen.compiler",)),
    ("emit", ("msgen.emit",)),
    # The run tools read and write the formats of the field; none imports the command
    # layer (its parsers, its dispatch), which nothing but cli.py imports.
    (
        "run tools",
        ("msgen.data", "msgen.doctor", "msgen.review", "msgen.hf", "msgen.ckpt", "msgen.runs"),
    ),
    ("command", ("msgen.commands", "msgen.cli")),
)


def modules(root: Path) -> dict[str, Path]:
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules `name` imports anywhere in its text."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "msgen"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source.split(".")[0] != "msgen":
                continue
            for alias in node.names:  # `from msgen.x import y` may name a module y
                sub = f"{source}.{alias.name}"
                out.add(sub if sub in known else source)
    return out - {name}


def graph(root: Path) -> dict[str, set[str]]:
    found = modules(root)
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def layer_of(module: str) -> int | None:
    best, rank = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), i
    return rank


def upward(edges: dict[str, set[str]]) -> list[str]:
    out = []
    for source, targets in sorted(edges.items()):
        for target in sorted(targets):
            if layer_of(target) > layer_of(source):
                out.append(
                    f"{source} ({LAYERS[layer_of(source)][0]}) imports "
                    f"{target} ({LAYERS[layer_of(target)][0]})"
                )
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_layer():
    assert [m for m in modules(PACKAGE) if layer_of(m) is None] == []


def test_imports_only_point_down():
    assert upward(graph(PACKAGE)) == []


def test_no_import_cycles():
    assert cycles(graph(PACKAGE)) == []


@pytest.fixture
def toy(tmp_path):
    """A package shaped like msgen with a layer breach hidden in a function."""
    root = tmp_path / "msgen"
    for folder in ("syntax", "checks"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "syntax" / "parser.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from msgen.checks import names\n"
    )
    (root / "checks" / "names.py").write_text(
        "def run():\n    from ..syntax import parser\n    return parser\n"
    )
    return root


def test_the_graph_sees_imports_in_functions_and_type_checking(toy):
    edges = graph(toy)
    assert edges["msgen.syntax.parser"] == {"msgen.checks.names"}
    assert edges["msgen.checks.names"] == {"msgen.syntax.parser"}
    assert upward(edges) == ["msgen.syntax.parser (syntax) imports msgen.checks.names (checks)"]
    assert cycles(edges) == [["msgen.checks.names", "msgen.syntax.parser"]]
