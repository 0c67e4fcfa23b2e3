"""The performance switches of mindformers 2.0.0's 910B configurations (docs/parity.md):
each one the generated train.py sets is read back from MindSpore's own context after
the generated code ran on the CPU build (a subprocess, so that this session's
context stays clean); each one msgen leaves out is shown absent, with the fact the
reason rests on read from the installed MindSpore.

The rule the expected values come from (docs/parity.md, not msgen's code): MC2 is
`computation_communication_fusion_level` 3 exactly when tp > 1 on an Atlas A2
(910B) device; backward's tp collectives overlap the weight-gradient matmuls
whenever tp > 1 on Ascend; jit_level O0 on every Ascend device, which the dropless
moe path with ep > 1 needs for its MoveTo.
"""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
from emit_fixtures import ROOT, SPECS, compile_spec, compiled

SPEED_UP = "parallel_speed_up.json"

# Runs the generated switches on the CPU build and prints what MindSpore's context holds.
PROBE = """
import importlib.util, json, sys
sys.path.insert(0, sys.argv[1])
import mindspore as ms
from mindspore import nn
from mindspore._c_expression import MSContext, ms_ctx_param
spec = importlib.util.spec_from_file_location("train", sys.argv[1] + "/train.py")
train = importlib.util.module_from_spec(spec)
spec.loader.exec_module(train)
ms.set_context(mode=ms.GRAPH_MODE)
out = {}
if hasattr(train, "performance_switches"):
    train.performance_switches()
out["jit_level"] = ms.get_context("jit_config").get("jit_level")
if hasattr(train, "semi_auto"):
    cell = train.semi_auto(nn.Dense(2, 2))
    out["alltoall"] = cell._enable_alltoall
ctx = MSContext.get_instance()
out["mc2_level"] = ctx.get_param(ms_ctx_param.compute_communicate_fusion_level)
out["grad_overlap"] = ctx.get_param(ms_ctx_param.matmul_grad_comm_overlap)
out["broadcast"] = ctx.get_param(ms_ctx_param.dataset_broadcast_opt_level)
print("PROBE " + json.dumps(out))
"""


def probe(folder: Path) -> dict:
    run = subprocess.run(
        [sys.executable, "-c", PROBE, str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith("PROBE ")]
    assert run.returncode == 0 and lines, run.stderr[-3000:]
    return json.loads(lines[-1][len("PROBE ") :])


@pytest.fixture(scope="module")
def variants(tmp_path_factory) -> dict[str, Path]:
    """tiny_llama (tp 2 on ascend910b) on other devices, and tiny_moe with ep 2."""
    out = tmp_path_factory.mktemp("switches")
    return {
        "910a": compile_spec(SPECS["tiny_llama"], out / "a", "--set", "cluster.device=ascend910a"),
        "a100": compile_spec(SPECS["tiny_llama"], out / "g", "--set", "cluster.device=a100_80g"),
        "moe_ep2": compile_spec(SPECS["tiny_moe"], out / "m", "--set", "mesh.ep=2"),
    }


def test_mc2_and_overlap_set_where_tp_splits_on_910b():
    """tiny_llama: tp 2 on ascend910b. MindSpore's parser of the speed-up file
    (context.py _set_speedup_config_path, through AutoParallel.transformer_opt) holds
    MC2 at level 3 (forward and backward) and the backward overlap on every
    collective kind (its True means all of them)."""
    got = probe(compiled("tiny_llama"))
    assert got["mc2_level"] == 3
    assert set(got["grad_overlap"].split(",")) >= {"AllGather", "ReduceScatter", "AllReduce"}
    assert got["jit_level"] == "O0"
    # enable_alltoall, mindformers' MoE setting, is AutoParallel's own default
    assert got["alltoall"] is True
    assert got["broadcast"] == 0  # dataset broadcast left out (see below)


def test_no_speed_up_without_tp(variants):
    """tiny_dp: tp 1, data parallel: nothing to fuse with a tp collective, no file, and
    MindSpore's context keeps its defaults; jit_level is still O0 on Ascend."""
    folder = compiled("tiny_dp")
    assert not (folder / SPEED_UP).exists()
    got = probe(folder)
    assert (got["mc2_level"], got["grad_overlap"], got["jit_level"]) == (0, "", "O0")


def test_mc2_only_on_atlas_a2(variants):
    """The 910A has no MC2 kernels (the fusion pass's aclnn ops): no fusion level,
    the overlap still; a GPU device gets none of the Ascend switches."""
    a = variants["910a"]
    assert json.loads((a / SPEED_UP).read_text()) == {"grad_matmul_communication_overlap": True}
    got = probe(a)
    assert (got["mc2_level"], got["jit_level"]) == (0, "O0")
    g = variants["a100"]
    assert not (g / SPEED_UP).exists()
    assert "performance_switches" not in (g / "train.py").read_text()


def test_jit_level_set_for_the_dropless_moveto(variants):
    """tiny_moe with ep 2: the dropless dispatch hands AlltoAllV its counts through
    MoveTo (model.py), which runs at jit_level O0 or O1 only; train.py sets O0 and
    says why."""
    folder = variants["moe_ep2"]
    model = ast.parse((folder / "model.py").read_text())
    calls = {ast.unparse(n.func) for n in ast.walk(model) if isinstance(n, ast.Call)}
    assert "ops.MoveTo" in calls
    train = ast.parse((folder / "train.py").read_text())
    (fn,) = [n for n in train.body if getattr(n, "name", "") == "performance_switches"]
    assert "MoveTo" in ast.get_docstring(fn)
    assert probe(folder)["jit_level"] in ("O0", "O1")


def test_dataset_broadcast_left_out():
    """mindformers sets dataset_broadcast_opt_level 3 and then requires dataset sink
    mode (trainer/base_trainer.py _check_sink_mode_with_ds_broadcast); MindSpore reads
    the broadcast data through the sink's queue (train/_utils.py enable_data_broadcast,
    train/dataset_helper.py). train.py feeds each step from a Python iterator
    (tiny_mixed reads a MindRecord), so it sets no broadcast and runs no sink."""
    folder = compiled("tiny_mixed")
    train = ast.parse((folder / "train.py").read_text())
    calls = [n for n in ast.walk(train) if isinstance(n, ast.Call)]
    names = {ast.unparse(n.func).rsplit(".", 1)[-1] for n in calls}
    assert "create_tuple_iterator" in names
    assert not names & {"Model", "data_sink", "DatasetHelper", "connect_network_with_dataset"}
    assert not any(k.arg == "dataset_sink_mode" for n in calls for k in n.keywords)
    assert "dataset_broadcast_opt_level" not in json.loads((folder / SPEED_UP).read_text())


def test_precision_and_memory_modes_are_mindspores_defaults():
    """mindformers' qwen3 configs set precision_mode must_keep_origin_dtype and
    memory_optimize_level O0: MindSpore 2.10's defaults (device_context/ascend/
    op_precision.py, runtime/memory.py set_memory), so train.py sets neither and
    calls set_memory with the spec's budget as max_device_memory."""
    from mindspore import runtime
    from mindspore.device_context.ascend import op_precision

    doc = inspect.getdoc(op_precision.precision_mode)
    assert 'to "must_keep_origin_dtype" by default' in doc
    assert inspect.signature(runtime.set_memory).parameters["optimize_level"].default == "O0"
    train = ast.parse((compiled("tiny_llama") / "train.py").read_text())
    calls = [n for n in ast.walk(train) if isinstance(n, ast.Call)]
    assert not any("precision_mode" in ast.unparse(n.func) for n in calls)
    (memory,) = [n for n in calls if ast.unparse(n.func) == "ms.runtime.set_memory"]
    assert {k.arg: ast.literal_eval(k.value) for k in memory.keywords} == {"max_size": "58GB"}
