"""The time model states its kernels (msgen/estimate/kernels.py): the basic path of an
op costs what its operators move, by hand; `estimate` says which path it priced, and
that is the path the generated code takes; each published run is priced with the
kernels its source ran."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from emit_fixtures import ROOT, compiled, plan

from msgen.analysis.facts import context
from msgen.estimate.flops import graph_ops
from msgen.estimate.kernels import KERNELS, generated, paths
from msgen.estimate.memory import estimate
from msgen.estimate.op_time import Machine, op_cost
from msgen.estimate.time import step_time
from msgen.ir.devices import DEVICES
from msgen.ir.mesh import RankMesh
from msgen.ops.base import tensor_bytes

PUBLISHED = json.loads((ROOT / "specs" / "validation" / "published.json").read_text())


def test_a_basic_rmsnorm_costs_what_its_operators_move():
    """tiny_llama's first rmsnorm over x of n elements, by hand: RmsNorm reads x and
    writes y, 2n elements and one kernel; Square (n in, n out), ReduceMean (n in),
    Add and Rsqrt (per row), Mul by the inverse (n in, n out), Mul by gamma (n in,
    n out) move 7n in six kernels. So the basic forward costs 5n more elements at
    the device's sustained bandwidth and 5 more kernel overheads. Backward moves three
    tensors where forward moved two (ops/base.py), at the same ratio, in twice the
    extra kernels."""
    p = plan("tiny_llama")
    spec = p.spec
    (norm,) = [of for of in graph_ops(p, "decoder") if of.node.name == "n1"]
    device = DEVICES[spec.cluster.device]
    sizes = dict(estimate(p).mesh)
    mesh = RankMesh.of(spec)

    def cost(fused):
        machine = Machine(device, device.matmul_flops[spec.model.dtype], mesh, sizes, fused)
        return op_cost(norm, context(spec), machine)

    fused, basic = cost(frozenset({"rmsnorm"})), cost(frozenset())
    (x,) = norm.inputs
    share = sizes["dp"]  # [dp, 1, 1]: each device normalises its dp slice
    n_bytes = tensor_bytes(x) / share
    bw = device.hbm_bandwidth * device.calibration.memory_efficiency
    overhead = device.calibration.kernel_overhead
    # the op's fused bytes are x and y (gamma's h elements are not counted)
    extra_bytes = 2.5 * 2 * n_bytes
    want = extra_bytes / bw + 5 * overhead
    assert basic.forward.compute - fused.forward.compute == pytest.approx(want, rel=1e-6)
    want = 1.5 * extra_bytes / bw + 10 * overhead
    assert basic.backward.compute - fused.backward.compute == pytest.approx(want, rel=1e-6)


def constructed(folder: Path) -> set[str]:
    """The names of what model.py calls: the primitives it builds."""
    module = ast.parse((folder / "model.py").read_text())
    return {
        ast.unparse(n.func).rsplit(".", 1)[-1] for n in ast.walk(module) if isinstance(n, ast.Call)
    }


@pytest.mark.parametrize(
    "name,kernels",
    [
        ("tiny_llama", {"rmsnorm", "rope", "mc2"}),
        ("tiny_mixed", {"swiglu", "rope", "flash", "mc2"}),
    ],
)
def test_the_estimate_prices_the_path_the_generated_code_takes(name, kernels):
    """A kernel is priced fused exactly when the generated tree builds its fused
    primitive (model.py), or for MC2 sets its fusion level (parallel_speed_up.json)."""
    folder = compiled(name)
    p = plan(name)
    t = step_time(p, estimate(p))
    assert t.kernels == paths(p.spec, generated(p))
    built = constructed(folder)
    speed_up = folder / "parallel_speed_up.json"
    mc2 = speed_up.exists() and json.loads(speed_up.read_text()).get(
        "computation_communication_fusion_level", 0
    )
    for kernel, path in t.kernels:
        if kernel == "mc2":
            runs_fused = bool(mc2)
        else:
            runs_fused = all(p in built for p in KERNELS[kernel].fused.split(", "))
        assert (path == "fused") == runs_fused, kernel
    assert {k for k, _ in t.kernels} == kernels


def test_estimate_prints_the_paths(capsys):
    from msgen.cli import main

    assert main(["estimate", str(ROOT / "specs" / "tiny_llama.msl")]) == 0
    text = capsys.readouterr().out
    p = plan("tiny_llama")
    line = ", ".join(f"{k} {path}" for k, path in paths(p.spec, generated(p)))
    assert f"  kernels: {line}\n" in text
    assert main(["estimate", str(ROOT / "specs" / "tiny_llama.msl"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["time"]["kernels"] == dict(
        paths(p.spec, generated(p))
    )


def test_every_published_run_names_the_kernels_it_ran():
    for run in PUBLISHED["runs"]:
        assert set(run["kernels"]) <= set(KERNELS), run["source"]
        assert run["kernels_source"], run["source"]
