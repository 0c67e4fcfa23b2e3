"""The global gradient norm's chain, read in the graph MindSpore compiles.

Under semi-auto parallel MindSpore completes each gradient's square sum with the
other slices' and stages' sums when it reaches an ExpandDims tagged `grad_scale`,
walking from the gradient to it through an allow-list of primitives
(parallel_postprocessor.cc); an op outside the list silently leaves a per-rank norm.
Public revisions allow Mul, Square, ReduceSum, Cast, Depend and Load, not the `Muls`
of a Python-float factor nor the `SumExt` of `.sum()`. So the step graph's frontend
IR (MS_DEV_SAVE_GRAPHS, after `optimize`) must hold, from every gradient (the backward
pass's output, the first op outside the list) to its tagged ExpandDims, exactly a Mul
(the unscaling factor), a Square and a ReduceSum, with only Cast, Depend or Load
between them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.emit_fixtures import compile_spec
from tests.test_rehearsal import CASES, write_spec

ALLOWED = {"Mul", "Square", "ReduceSum", "Cast", "Depend", "Load"}
NODE = re.compile(r"\s*(%\d+)\([^)]*\) = (?:PrimFunc_)?([A-Za-z_]\w*)\(")


def parse(text: str) -> dict[str, tuple[str, list[str], bool]]:
    """node -> (primitive, input nodes or parameters, tagged grad_scale) of one graph."""
    nodes = {}
    for line in text.splitlines():
        m = NODE.match(line)
        if not m:
            continue
        end, depth = m.end(), 1
        while depth and end < len(line):
            depth += {"(": 1, ")": -1}.get(line[end], 0)
            end += 1
        inputs = re.findall(r"%\w+", line[m.end() : end])
        nodes[m.group(1)] = (m.group(2), inputs, "grad_scale: Bool(1)" in line[end:])
    return nodes


def chains(nodes) -> list[list[str]]:
    """For each tagged ExpandDims, the primitives from it back to the gradient, the
    gradient's own primitive last."""
    out = []
    for op, inputs, tagged in nodes.values():
        if op != "ExpandDims" or not tagged:
            continue
        chain, node = [], inputs[0]
        while node in nodes and nodes[node][0] in ALLOWED:
            chain.append(nodes[node][0])
            node = nodes[node][1][0] if nodes[node][1] else None
        chain.append(nodes[node][0] if node in nodes else str(node))
        out.append(chain)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("case", ["z0_pp2_mb2_fixed", "z0_pp1_mb2_dynamic"])
def test_every_gradient_reaches_its_tagged_expand_dims_through_the_allowed_ops(case, tmp_path):
    tree = compile_spec(write_spec(tmp_path, *CASES[case]), tmp_path / "out")
    graphs = tmp_path / "ir"
    env = {
        **os.environ,
        "GLOG_v": "3",
        "MS_DEV_SAVE_GRAPHS": "1",
        "MS_DEV_SAVE_GRAPHS_PATH": str(graphs),
    }
    proc = subprocess.run(
        [sys.executable, "train.py", "--standalone", "--synthetic", "--steps", "1"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    texts = [p.read_text() for p in graphs.glob("[0-9]*_optimize_*.ir")]  # the frontend's
    # node numbers restart in every graph of a dump: parse each on its own
    graphs_ = [g for text in texts for g in re.split(r"^subgraph @", text, flags=re.M)[1:]]
    found = [chain for graph in graphs_ for chain in chains(parse(graph))]
    assert found
    for chain in found:
        core = [op for op in chain[:-1] if op not in ("Cast", "Depend", "Load")]
        assert core == ["ReduceSum", "Square", "Mul"], chain
