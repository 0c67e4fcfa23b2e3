"""The expert-parallel axis against the mesh: ep is carved out of dp (MSL211). That
ep divides each moe op's experts is the op's own layout rule (MSL212, msgen/ops/moe.py)."""

from __future__ import annotations

from msgen.analysis.facts import Facts
from msgen.diagnostics import Diagnostic, error
from msgen.ir.models import Spec


def run(spec: Spec, facts: Facts) -> list[Diagnostic]:
    mesh = spec.mesh
    if mesh.ep < 1 or mesh.dp % mesh.ep == 0:
        return []
    divisors = [d for d in range(1, mesh.dp + 1) if mesh.dp % d == 0]
    return [
        error(
            "MSL211",
            f"ep = {mesh.ep} does not divide dp = {mesh.dp}: expert parallelism is carved out "
            "of data parallelism",
            mesh.spans.get("ep", mesh.span),
            f"ep is one of {', '.join(map(str, divisors))}",
        )
    ]
