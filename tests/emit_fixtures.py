"""Compiled specs for the tests that run generated code: spec -> plan -> emit, the real path.

`compiled(name)` compiles one spec (once per test session) into a scratch folder
and returns the model's folder (model.py, train.py, plan.json, ...); tests that
write into a folder (training runs) copy it first. `load(folder, module)` imports
a generated module; `plan(name)` is the checked Plan the folder was emitted from.

The specs: `tiny` (layernorm, exact gelu, dropout, learned positions, tied output
layer, full recompute, pp = 2) and `tiny_llama` (rmsnorm, GQA, rope, silu * up,
no biases, selective recompute, pp = 2) from specs/, and tests/specs/tiny_mixed.msl
for the paths those leave out (pp = 1, flash asked for, attention dropout, swiglu,
tanh gelu, a constant operand, untied output layer with bias, dynamic loss scale,
MindRecord data, no device_ips) and tests/specs/tiny_interleaved.msl (the interleaved
pipeline schedule: 4 layers over pp = 2 stages of 2 chunks; a fixed loss scale; fusion
ids on network parameters and bucketed layer parameters); tests/specs/tiny_dp.msl is
the data-parallel mesh that test_multirank.py trains under msrun. tests/specs/tiny_moe.msl
(a mixture of experts, q/k norms) and tiny_moe_dp.msl (its data-parallel mesh) are
checked and trained by tests/test_moe_code.py and test_moe_train.py, not with TINY;
tests/specs/tiny_mla.msl (multi-head latent attention) by tests/test_mla_code.py.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import io
import json
import shutil
import sys
import tempfile
from functools import cache
from pathlib import Path

from msgen.checks.reserved import camel

ROOT = Path(__file__).resolve().parents[1]
SPECS = {
    "tiny": ROOT / "specs" / "tiny.msl",
    "tiny_llama": ROOT / "specs" / "tiny_llama.msl",
    "tiny_mixed": ROOT / "tests" / "specs" / "tiny_mixed.msl",
    "tiny_interleaved": ROOT / "tests" / "specs" / "tiny_interleaved.msl",
    "tiny_dp": ROOT / "tests" / "specs" / "tiny_dp.msl",
    "tiny_moe": ROOT / "tests" / "specs" / "tiny_moe.msl",
    "tiny_moe_dp": ROOT / "tests" / "specs" / "tiny_moe_dp.msl",
    "tiny_mla": ROOT / "tests" / "specs" / "tiny_mla.msl",
    "tiny_mtp": ROOT / "tests" / "specs" / "tiny_mtp.msl",
    "tiny_mtp_moe": ROOT / "tests" / "specs" / "tiny_mtp_moe.msl",
    "gpt7b": ROOT / "specs" / "gpt7b.msl",
    "llama13b": ROOT / "specs" / "llama13b.msl",
}
TINY = ("tiny", "tiny_llama", "tiny_mixed", "tiny_interleaved")  # small enough for the CPU
BIG = ("gpt7b", "llama13b")  # instantiated without allocating (no_init_parameters)


@cache
def _scratch() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="msgen-compiled-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def compile_spec(spec: Path, out: Path, *options: str) -> Path:
    """`msgen compile SPEC -o OUT [OPTIONS]` in-process; returns OUT/<model name>."""
    from msgen.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = main(["compile", str(spec), "-o", str(out), *options])
    assert status == 0, f"msgen compile {spec} exited {status}:\n{err.getvalue()}"
    (folder,) = [p for p in out.iterdir() if p.is_dir() and (p / "plan.json").is_file()]
    return folder


@cache
def compiled(name: str) -> Path:
    """The compiled folder of SPECS[name] (shared: copy it before writing into it)."""
    return compile_spec(SPECS[name], _scratch() / name)


def copy_compiled(name: str, dest: Path) -> Path:
    shutil.copytree(compiled(name), dest)
    return dest


def plan_json(name: str) -> dict:
    return json.loads((compiled(name) / "plan.json").read_text())


def every_param(doc: dict) -> list[dict]:
    """plan.json's parameters one per path: the network's as listed, the repeated
    layers' runs expanded copy by copy."""
    out = list(doc["params"])
    for run in doc["layer_params"]:
        for copy in range(*run["copies"]):
            entry = {k: v for k, v in run.items() if k not in ("layer", "name", "copies")}
            out.append({"path": f"{run['layer']}.{copy}.{run['name']}", **entry})
    return out


def holders(doc: dict, rank: int, axes: tuple[str, ...]) -> list[int]:
    """The ranks reached from `rank` through plan.json's groups over `axes`: given the
    axes a parameter's split leaves unused (the experts' edp in place of dp), the
    ranks holding the same slice of it as `rank`, in rank order."""
    found, frontier = {rank}, [rank]
    while frontier:
        r = frontier.pop()
        for axis in axes:
            for peer in next(g for g in doc["groups"][axis] if r in g):
                if peer not in found:
                    found.add(peer)
                    frontier.append(peer)
    return sorted(found)


def copy_placement(layer: dict, key: str) -> list[int]:
    """A repeated layer's `stage` (or `segment`) per copy, from its placement runs."""
    return [run[key] for run in layer["placement"] for _ in range(*run["copies"])]


@cache
def plan(name: str):
    """The checked Plan of SPECS[name] (what emit() wrote the folder from)."""
    from msgen.analysis.plan import build_plan
    from msgen.compiler import analyze

    result = analyze(SPECS[name])
    assert result.ok, [d.message for d in result.diagnostics]
    return build_plan(result.spec, result.facts)


def load(folder: Path, module: str):
    """Import folder/<module>.py as a fresh module; train.py finds its own model.py."""
    sys.modules.pop("model", None)
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.spec_from_file_location(
            f"{folder.name}_{module}", folder / f"{module}.py"
        )
        loaded = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded)
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("model", None)
    return loaded


def network_class(model, plan_doc: dict):
    """The network cell class of a loaded model.py (CamelCase of the model name)."""
    name = camel(plan_doc["model"])
    return getattr(model, name)
