"""The performance switches of mindformers 2.0.0's 910B configurations (docs/parity.md):
each one the generated train.py sets is read back from MindSpore's own context after
the generated code ran on the CPU build (a subprocess, so that the test process's
context stays clean); each one msgen leaves out is shown absent, with the fact the
reason rests on read from the installed MindSpore.

The rule the expected values come from (docs/parity.md, not msgen's code): MC2 is
`computation_communication_fusion_level` 3 exactly when tp > 1 on an Atlas A2
(910B) device with fp16 or bf16 matmuls; backward's tp collectives overlap the weight-gradient matmuls
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

# Runs each folder's generated switches on the CPU build and prints what MindSpore's
# context then holds; between folders the context goes back to MindSpore's defaults.
PROBE = """
import importlib.util, json, sys
import mindspore as ms
from mindspore import nn
from mindspore._c_expression import MSContext, ms_ctx_param
from mindspore.context import _context
ms.set_context(mode=ms.GRAPH_MODE)
ctx = MSContext.get_instance()
for folder in sys.argv[1:]:
    ctx.set_param(ms_ctx_param.jit_level, "")
    _context().jit_config = {}
    ctx.set_param(ms_ctx_param.compute_communicate_fusion_level, 0)
    ctx.set_param(ms_ctx_param.matmul_grad_comm_overlap, "")
    sys.path.insert(0, folder)
    sys.modules.pop("model", None)
    spec = importlib.util.spec_from_file_location("train", folder + "/train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    sys.path.remove(folder)
    out = {}
    if hasattr(train, "performance_switches"):
        train.performance_switches()
    out["jit_level"] = ms.get_context("jit_config").get("jit_level")
    if hasattr(train, "semi_auto"):
        out["alltoall"] = train.semi_auto(nn.Dense(2, 2))._enable_alltoall
    out["mc2_level"] = ctx.get_param(ms_ctx_param.compute_communicate_fusion_level)
    out["grad_overlap"] = ctx.get_param(ms_ctx_param.matmul_grad_comm_overlap)
    out["broadcast"] = ctx.get_param(ms_ctx_param.dataset_broadcast_opt_level)
    print("PROBE " + json.dumps([folder, out]))
"""


@pytest.fixture(scope="module")
def variants(tmp_path_factory) -> dict[str, Path]:
    """tiny_llama (tp 2 on ascend910b, fp32) and in bf16, tiny_dp (tp 1), tiny_llama
    on other devices, and tiny_moe with ep 2."""
    out = tmp_path_factory.mktemp("switches")
    llama = SPECS["tiny_llama"]
    return {
        "tiny_llama": compiled("tiny_llama"),
        "bf16": compile_spec(llama, out / "b", "--set", "model.dtype=bf16"),
        "tiny_dp": compiled("tiny_dp"),
        "910a": compile_spec(
            llama, out / "a", "--set", "cluster.device=ascend910a", "--set", "model.dtype=bf16"
        ),
        "a100": compile_spec(llama, out / "g", "--set", "cluster.device=a100_80g"),
        "moe_ep2": compile_spec(SPECS["tiny_moe"], out / "m", "--set", "mesh.ep=2"),
    }


@pytest.fixture(scope="module")
def probed(variants) -> dict[str, dict]:
    """What MindSpore's context holds after each variant's switches ran (one process)."""
    folders = {str(folder): key for key, folder in variants.items() if key != "a100"}
    run = subprocess.run(
        [sys.executable, "-c", PROBE, *folders],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    found = [
        json.loads(line[len("PROBE ") :])
        for line in run.stdout.splitlines()
        if line.startswith("PROBE ")
    ]
    assert run.returncode == 0 and len(found) == len(folders), run.stderr[-3000:]
    return {folders[folder]: out for folder, out in found}


def test_mc2_and_overlap_set_where_tp_splits_on_910b(probed):
    """tiny_llama in bf16: tp 2 on ascend910b. MindSpore's parser of the speed-up file
    (context.py _set_speedup_config_path, through AutoParallel.transformer_opt) holds
    MC2 at level 3 (forward and backward) and the backward overlap on every
    collective kind (its True means all of them). In fp32 the pass would fuse
    nothing: the overlap alone."""
    fp32 = probed["tiny_llama"]
    assert (fp32["mc2_level"], bool(fp32["grad_overlap"])) == (0, True)
    got = probed["bf16"]
    assert got["mc2_level"] == 3
    assert set(got["grad_overlap"].split(",")) >= {"AllGather", "ReduceScatter", "AllReduce"}
    assert got["jit_level"] == "O0"
    # enable_alltoall, mindformers' MoE setting, is AutoParallel's own default
    assert got["alltoall"] is True
    assert got["broadcast"] == 0  # dataset broadcast left out (see below)


def test_no_speed_up_without_tp(variants, probed):
    """tiny_dp: tp 1, data parallel: nothing to fuse with a tp collective, no file, and
    MindSpore's context keeps its defaults; jit_level is still O0 on Ascend."""
    assert not (variants["tiny_dp"] / SPEED_UP).exists()
    got = probed["tiny_dp"]
    assert (got["mc2_level"], got["grad_overlap"], got["jit_level"]) == (0, "", "O0")


def test_mc2_only_on_atlas_a2(variants, probed):
    """The 910A has no MC2 kernels (the fusion pass's aclnn ops): no fusion level,
    the overlap still (both in bf16, which MC2 would fuse on a 910B); a GPU device
    gets none of the Ascend switches."""
    a = variants["910a"]
    assert json.loads((a / SPEED_UP).read_text()) == {"grad_matmul_communication_overlap": True}
    got = probed["910a"]
    assert (got["mc2_level"], got["jit_level"]) == (0, "O0")
    g = variants["a100"]
    assert not (g / SPEED_UP).exists()
    assert "performance_switches" not in (g / "train.py").read_text()


def test_jit_level_set_for_the_dropless_moveto(variants, probed):
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
    assert probed["moe_ep2"]["jit_level"] in ("O0", "O1")


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


def test_left_out_switches_stay_unset(variants):
    """The rows docs/parity.md leaves out: no memory pool block size (set_memory takes
    max_size alone, checked above), no recursion limit, no micro-batch interleaving,
    no optimizer shard size (hsdp over the whole replica group), no speed-up key but
    the two emitted, no MS_DEV_RUNTIME_CONF in the launch scripts."""
    for folder in (compiled("tiny_llama"), compiled("tiny_mixed"), variants["moe_ep2"]):
        train = ast.parse((folder / "train.py").read_text())
        calls = [n for n in ast.walk(train) if isinstance(n, ast.Call)]
        names = {ast.unparse(n.func).rsplit(".", 1)[-1] for n in calls}
        assert not names & {"set_recursion_limit", "MicroBatchInterleaved"}
        for hsdp in (n for n in calls if ast.unparse(n.func).endswith(".hsdp")):
            assert [k.arg for k in hsdp.keywords] == ["optimizer_level"]
        if (folder / SPEED_UP).exists():
            keys = set(json.loads((folder / SPEED_UP).read_text()))
            assert keys <= {
                "computation_communication_fusion_level",
                "grad_matmul_communication_overlap",
            }
        for script in (folder / "launch").glob("*.sh"):
            assert "MS_DEV_RUNTIME_CONF" not in script.read_text()


# Every switch row of docs/parity.md and the test that shows it set or left out.
PARITY_TESTS = {
    "graph mode": "test_generated.py",
    "`jit_level`": "test_switches.py::test_jit_level_set_for_the_dropless_moveto",
    "MC2 (`computation_communication_fusion_level`)": (
        "test_switches.py::test_mc2_and_overlap_set_where_tp_splits_on_910b"
    ),
    "`matmul_grad_comm_overlap` (`grad_matmul_communication_overlap`)": (
        "test_switches.py::test_mc2_only_on_atlas_a2"
    ),
    "`dataset_broadcast_opt_level`": "test_switches.py::test_dataset_broadcast_left_out",
    "`enable_flash_attention_load_balance`, `enable_allreduce_slice_to_reducescatter`": (
        "test_switches.py::test_left_out_switches_stay_unset"
    ),
    "`enable_alltoall`": "test_switches.py::test_mc2_and_overlap_set_where_tp_splits_on_910b",
    "`max_device_memory`": (
        "test_switches.py::test_precision_and_memory_modes_are_mindspores_defaults"
    ),
    "`mempool_block_size`": (
        "test_switches.py::test_precision_and_memory_modes_are_mindspores_defaults"
    ),
    "`memory_optimize_level`": (
        "test_switches.py::test_precision_and_memory_modes_are_mindspores_defaults"
    ),
    "`precision_mode`": "test_switches.py::test_precision_and_memory_modes_are_mindspores_defaults",
    "`max_call_depth`": "test_switches.py::test_left_out_switches_stay_unset",
    "parallel mode": "test_parallel_audit.py::rule_parallel_mode_follows_the_mesh",
    "`dataset_strategy`": "test_parallel_audit.py::rule_dataset_strategy_matches_the_reads",
    "`gradients_mean`": "test_parallel_audit.py::rule_reducer_follows_the_mirror",
    "parallel optimizer (`enable_parallel_optimizer`, threshold 64)": (
        "test_parallel_audit.py::rule_reducer_follows_the_mirror"
    ),
    "`optimizer_weight_shard_size`": "test_switches.py::test_left_out_switches_stay_unset",
    "pipeline (`pipeline_interleave`, `seqpipe`)": (
        "test_generated.py::test_interleaved_layers_run_on_their_virtual_stages"
    ),
    "`gradient_aggregation_group`": "test_plan.py::test_the_emitted_fusion_tables_are_the_plan_ids",
    "`micro_batch_interleave_num`": "test_switches.py::test_left_out_switches_stay_unset",
    "`use_seq_parallel`": "test_estimate.py::test_sequence_parallel_falls_out_of_the_splits",
    "recompute (`mp_comm_recompute`, `parallel_optimizer_comm_recompute`)": "test_recompute.py",
    "`lazy_inline`": "test_parallel_audit.py::rule_lazy_inline_on_ascend",
    "msrun launch": "test_launch.py",
    '`MS_DEV_RUNTIME_CONF="multi_stream:true"`': (
        "test_switches.py::test_left_out_switches_stay_unset"
    ),
}


def test_every_parity_switch_has_its_test():
    """docs/parity.md's switch rows are PARITY_TESTS' keys, and each named test exists."""
    doc = (ROOT / "docs" / "parity.md").read_text()
    table = doc[doc.index("## Switches") :]
    rows = [line.split(" | ")[0][2:] for line in table.splitlines() if line.startswith("| ")]
    assert rows[1:] == list(PARITY_TESTS)  # the header aside
    for target in PARITY_TESTS.values():
        path, _, name = target.partition("::")
        source = (ROOT / "tests" / path).read_text()
        assert not name or f"def {name}(" in source, target
