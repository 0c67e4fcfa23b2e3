"""The front end in one place: text -> AST -> IR -> analysis and checks -> budget.

Every stage returns diagnostics; none raises on a bad spec.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from msgen.analysis.facts import Facts
from msgen.checks import run_checks
from msgen.diagnostics import Diagnostic, has_errors, printable
from msgen.estimate import budget
from msgen.ir.models import Spec
from msgen.lowering.lower import lower
from msgen.syntax import parse, read_source
from msgen.syntax.overrides import apply_overrides


@dataclass
class Result:
    file: str
    text: str
    spec: Spec | None = None
    facts: Facts | None = None
    diagnostics: list[Diagnostic] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.spec is not None and not has_errors(self.diagnostics)


def display_path(path: Path) -> str:
    """The spec as headers and messages name it: relative to the current
    directory in posix form, or its file name when it lies outside; escaped where
    it is not printable, so no file name can end a comment line in generated code."""
    try:
        name = path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        name = path.name
    return printable(name)


def analyze_text(text: str, file: str, base_dir: Path, overrides: list[str] = ()) -> Result:
    result = Result(file=file, text=text)
    module, diags = parse(text, file)
    result.diagnostics += diags
    if module is None:
        return result
    if overrides:
        module, diags = apply_overrides(module, list(overrides))
        result.diagnostics += diags
        if has_errors(diags):
            return result
    spec, diags = lower(module, text, file, base_dir)
    result.diagnostics += diags
    if spec is None or has_errors(diags):
        return result
    result.spec = spec
    result.facts, diags = run_checks(spec)
    result.diagnostics += diags
    if not has_errors(result.diagnostics):
        # the estimate needs the graph's layouts, a valid pipeline and a known device
        result.diagnostics += budget.run(spec, result.facts)
    return result


def analyze(path: Path, overrides: list[str] = ()) -> Result:
    """Read and check one spec file (the caller handles a file that cannot be read)."""
    text = read_source(path)
    return analyze_text(text, display_path(path), path.parent, overrides)
