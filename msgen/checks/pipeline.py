"""Pipeline checks (to be completed)."""

from __future__ import annotations

from msgen.checks.facts import Facts
from msgen.diagnostics import Diagnostic
from msgen.ir.models import Spec


def run(spec: Spec, facts: Facts) -> list[Diagnostic]:
    return []
