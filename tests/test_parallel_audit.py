"""What the CPU cannot run (tp, pp, zero > 0: semi-auto parallel), audited in the code.

MindSpore's CPU build runs only data-parallel mode under msrun (test_multirank.py
trains that for real). For the other meshes each rule below reads a generated tree's
train.py or model.py (with `ast`) and returns what breaks it; its docstring names the
MindSpore 2.10 source (inside the installed `mindspore` package) the rule comes from.
Every committed tree, and the compiled test specs, must pass every rule, and each rule
is shown to catch a deliberately broken tree. Last, the strategies MindSpore records on
the primitives that take parameters (`in_strategy`, set by `.shard`) are compared with
the layouts plan.json gives those parameters and their inputs.
"""

from __future__ import annotations

import ast
import json
import shutil
from fnmatch import fnmatch
from math import prod
from pathlib import Path

import pytest

from msgen.checks.reserved import camel
from tests.emit_fixtures import ROOT, SPECS, compile_spec, compiled, load, network_class

COMMITTED = sorted(p.parent.name for p in (ROOT / "generated").glob("*/train.py"))
TREES = (*COMMITTED, "tiny_mixed", "tiny_interleaved", "tiny_dp")


def tree(name: str) -> Path:
    committed = ROOT / "generated" / name
    return committed if committed.is_dir() else compiled(name)


def plan_of(folder: Path) -> dict:
    return json.loads((folder / "plan.json").read_text())


def semi_auto(doc: dict) -> bool:
    mesh = doc["mesh"]
    return mesh["tp"] > 1 or mesh["pp"] > 1 or mesh.get("ep", 1) > 1 or doc["estimate"]["zero"] > 0


def function(module: ast.Module, name: str) -> ast.FunctionDef:
    for node in ast.walk(module):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise AssertionError(f"no function {name}")


def constant(module: ast.Module, name: str):
    """The literal value of the module-level `name = ...`."""
    for node in module.body:
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [name]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"no constant {name}")


def method(module: ast.Module, cls: str, name: str) -> ast.FunctionDef:
    (klass,) = [n for n in module.body if isinstance(n, ast.ClassDef) and n.name == cls]
    return function(klass, name)


def unpacked(target: ast.AST, value: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    """(name, value) pairs of `a, b = x, y` and `a, b = (x, y) if c else (z, w)` (both
    branches, the first first); the whole value for any other unpacking."""
    if not isinstance(target, ast.Tuple):
        return [(target, value)]
    branches = [value.body, value.orelse] if isinstance(value, ast.IfExp) else [value]
    if all(isinstance(b, ast.Tuple) and len(b.elts) == len(target.elts) for b in branches):
        return [(t, b.elts[i]) for b in branches for i, t in enumerate(target.elts)]
    return [(t, value) for t in target.elts]


def assignments(body: ast.AST) -> dict[str, list[ast.AST]]:
    """Name (or self.attr) -> the values assigned to it, in order."""
    out: dict[str, list[ast.AST]] = {}
    for node in ast.walk(body):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                for name, value in unpacked(target, node.value):
                    out.setdefault(ast.unparse(name), []).append(value)
    return out


def depends_on(name: str, assigned: dict[str, list[ast.AST]], seen=None) -> set[str]:
    """Every expression text that feeds `name` through the assignments of one function."""
    seen = set() if seen is None else seen
    if name in seen:
        return set()
    seen.add(name)
    found = set()
    for value in assigned.get(name, []):
        for node in ast.walk(value):
            found.add(ast.unparse(node))
            if isinstance(node, ast.Name):
                found |= depends_on(node.id, assigned, seen)
    return found


# The rules ----------------------------------------------------------------------------


def rule_global_gradient_norm(folder: Path) -> list[str]:
    """The logged and clipped norm is global: every gradient's square sum goes through an
    ExpandDims tagged `grad_scale`, which semi-auto parallel completes with the other
    slices' and stages' sums (ops/function/clip_func.py, `expand_dims`;
    HandleGlobalNormScale in the frontend library)."""
    module = ast.parse((folder / "train.py").read_text())
    tagged = {
        ast.unparse(node.targets[0])
        for node in module.body
        if isinstance(node, ast.Assign)
        and ast.unparse(node.value) == "ops.ExpandDims().add_prim_attr('grad_scale', True)"
    }
    if not tagged:
        return ["no ExpandDims tagged grad_scale"]
    construct = method(module, "TrainStep", "construct")
    feeds = depends_on("norm", assignments(construct))
    if not any(f"{name}(" in text for name in tagged for text in feeds):
        return ["the gradient norm does not go through the grad_scale ExpandDims"]
    problems = []
    if "self.reduce_sum(ops.square(g))" not in " ".join(feeds):
        problems.append("the norm is not the square sum of the gradients")
    if "GRAD_CLIP" in ast.unparse(construct) and "norm" not in depends_on(
        "clip", assignments(construct)
    ):
        problems.append("the clip does not use the global norm")
    return problems


def rule_gradient_factor_is_a_tensor(folder: Path) -> list[str]:
    """The gradients are unscaled by a Tensor factor: with a Python float the product
    compiles to `Muls`, which public revisions of the global-norm pass
    (parallel_postprocessor.cc, the walk from a gradient to the grad_scale ExpandDims)
    do not allow, and the norm silently stays per rank. mindformers core/clip_grad.py
    multiplies by Tensors too."""
    module = ast.parse((folder / "train.py").read_text())
    construct = method(module, "TrainStep", "construct")
    values = [ast.unparse(v) for v in assignments(construct).get("factor", [])]
    if not values:
        return ["no gradient factor"]
    init = assignments(method(module, "TrainStep", "__init__"))
    problems = []
    for value in values:
        if value == "self.factor":
            value = " ".join(ast.unparse(v) for v in init.get("self.factor", []))
            if not value.startswith("Tensor("):
                problems.append(f"self.factor = {value}: not a Tensor")
        elif "scale" not in value:
            problems.append(f"factor = {value}: not a Tensor")
    return problems


def replicas(split: list[str], mesh: dict[str, int]) -> int:
    """Devices of a stage (dp x tp; ep is carved out of dp) holding the same slice."""
    return mesh["dp"] * mesh["tp"] // prod(splits(split, mesh))


def rule_reducer_follows_the_mirror(folder: Path) -> list[str]:
    """Under semi-auto parallel a step of micro-batches (pp > 1 or micro_batches > 1)
    reads its gradients through GradReducer, built (as the rehearsal's stand-in) with
    where each parameter's gradient is. From MindSpore 2.10's source: GradAccumulation
    (pp = 1) and Pipeline both make the pass insert micro-step mirrors (CreateMirrorOps),
    but only for a parameter another device of its stage holds too (InferMirrorOps,
    CreateGroupByTensorMap: no group for one device); a mirror returns the gradient only
    with the parallel optimizer on (zero > 0, `hsdp`) and otherwise the constant 1.0,
    having written it to `accu_grads`, and a parameter without one receives 0 and keeps
    it in `accu_grads` (ops/_grad_experimental/grad_comm_ops.py, the micro-step mirror's
    and _VirtualAssignAdd's bprops). So GRADIENT_FROM is "mirror" exactly for zero > 0
    and a parameter with replicas in its stage, by plan.json's splits. A step of one
    micro-batch builds no buffer."""
    doc = plan_of(folder)
    if not semi_auto(doc):
        return []
    module = ast.parse((folder / "train.py").read_text())
    zero, mesh = doc["estimate"]["zero"], doc["mesh"]
    text = ast.unparse(module)
    problems = []
    hsdp = f"cell.hsdp(optimizer_level='level{zero}')" in text
    if hsdp != (zero > 0):
        problems.append(f"hsdp {hsdp} with zero = {zero}")
    calls = [
        n
        for n in ast.walk(module)
        if isinstance(n, ast.Call) and ast.unparse(n.func) in ("GradReducer", "RehearsedMirror")
    ]
    accumulates = mesh["pp"] > 1 or doc["micro_batches"] > 1
    if {ast.unparse(c.func) for c in calls} != (
        {"GradReducer", "RehearsedMirror"} if accumulates else set()
    ):
        problems.append(
            f"reducer cells {sorted(ast.unparse(c.func) for c in calls)}, accumulating {accumulates}"
        )
    if not accumulates:
        return problems
    tables = [n.value for n in module.body if isinstance(n, ast.Assign)
              and ast.unparse(n.targets[0]) == "GRADIENT_FROM"]  # fmt: skip
    if len(tables) != 1:
        return problems + ["no GRADIENT_FROM table"]
    emitted = ast.literal_eval(tables[0])
    wanted = {p["path"]: p["split"] for p in doc["params"]}
    wanted |= {f"{r['layer']}.*.{r['name']}": r["split"] for r in doc["layer_params"]}
    for pattern, split in wanted.items():
        source = "mirror" if zero > 0 and replicas(split, mesh) > 1 else "accu_grads"
        if emitted.get(pattern) != source:
            problems.append(f"{pattern}: GRADIENT_FROM {emitted.get(pattern)}, not {source}")
    if "return tuple((gradient_from(p.name) == 'mirror' for p in parameters))" not in ast.unparse(
        function(module, "from_mirror_of")
    ):
        problems.append("from_mirror_of does not read GRADIENT_FROM")
    for cls in ("GradReducer", "RehearsedMirror"):
        values = assignments(method(module, cls, "__init__")).get("self.from_mirror", [])
        if [ast.unparse(v) for v in values] != ["from_mirror_of(parameters)"]:
            problems.append(f"{cls}.from_mirror is not from_mirror_of(parameters)")
        if "self.from_mirror, grads, self.accu_grads" not in ast.unparse(
            method(module, cls, "construct")
        ):
            problems.append(f"{cls} does not map its gradients with self.from_mirror")
    return problems


def rule_evaluation_skips_the_pipeline(folder: Path) -> list[str]:
    """The eval cell never runs the training `Pipeline` wrapper forward-only: MindSpore's
    pipeline pass labels micro-batches only in training graphs (pipeline_interleave.cc,
    LabelMicroBatch), so a validation set with pp > 1 is refused at check time (MSL514)
    and no tree with a pipeline builds an EvalStep."""
    module = ast.parse((folder / "train.py").read_text())
    calls = {
        ast.unparse(n.func): n
        for n in ast.walk(function(module, "build"))
        if isinstance(n, ast.Call) and ast.unparse(n.func) in ("EvalStep", "TrainStep")
    }
    if "EvalStep" not in calls:
        return []
    if plan_of(folder)["mesh"]["pp"] > 1:
        return ["an eval cell under a pipeline"]
    wrapped = ast.unparse(calls["EvalStep"].args[0])
    if wrapped == "step_cell.network":
        wrapped = ast.unparse(calls["TrainStep"].args[0])
    return [f"the eval cell wraps {wrapped}"] if wrapped.startswith("Pipeline(") else []


def rule_overflow_verdict_is_shared(folder: Path) -> list[str]:
    """Every rank skips an update together: the not-finite flag of amp.all_finite (no
    collective of its own, amp.py) is all-reduced over the ranks before the branch, as
    the loss-scale cells do (nn/wrap/loss_scale.py, `self.allreduce(flag_sum)`)."""
    module = ast.parse((folder / "train.py").read_text())
    init = method(module, "TrainStep", "__init__")
    construct = method(module, "TrainStep", "construct")
    reducers = {
        name
        for name, values in assignments(init).items()
        if any("ops.AllReduce()" in ast.unparse(v) for v in values)
    }
    branches = [
        node
        for node in ast.walk(construct)
        if isinstance(node, ast.If) and "self.optimizer(" in ast.unparse(node)
    ]
    if len(branches) != 1:
        return ["the update is not guarded by one branch"]
    (branch,) = branches
    condition = ast.unparse(branch.test)
    before = ast.Module(
        body=[s for s in construct.body if s.lineno < branch.lineno], type_ignores=[]
    )
    feeds = depends_on(condition, assignments(before)) | {condition}
    calls = {f"{name}(" for name in reducers}
    if not any(call in text for call in calls for text in feeds):
        return [f"`if {condition}:` does not read a flag reduced over the ranks"]
    if "amp.all_finite(grads)" not in " ".join(feeds):
        return ["the reduced flag is not all_finite of the gradients"]
    adjust = [n for n in ast.walk(construct) if "self.scaler.adjust(" in ast.unparse(n)]
    if adjust and f"self.scaler.adjust({condition})" not in ast.unparse(construct):
        return ["the loss scale is adjusted by another flag than the shared one"]
    return []


def rule_dataset_strategy_matches_the_reads(folder: Path) -> list[str]:
    """The batch dim the graph takes as split equals the reader's sharding. With the
    string "data_parallel", dim 0 is multiplied by all devices of a stage
    (parallel/_utils.py, `_to_full_shapes`), but the reader shards by dp only (ranks of a
    tp group read the same rows), so the tuple form `((DP, 1), ...)` is declared
    (mindformers trainer/base_trainer.py does the same). Data-parallel trees declare
    none: there each rank's batch is its own."""
    source = (folder / "train.py").read_text()
    module = ast.parse(source)
    doc = plan_of(folder)
    mesh = {"DP": doc["mesh"]["dp"], "TP": doc["mesh"]["tp"], "PP": doc["mesh"]["pp"]}
    main = function(module, "main")
    assigned = assignments(main)
    # shards, shard = (DP, dp_index) if distributed else (1, 0): the distributed branch
    read_shards = eval(ast.unparse(assigned["shards"][0]), {}, mesh)
    read_index = ast.unparse(assigned["dp_index"][0])
    problems = []
    # DP_STRIDE is the mesh owner's (tests/test_mesh.py holds it against plan.json)
    if read_shards != mesh["DP"] or read_index != "rank // DP_STRIDE % DP":
        problems.append(f"the reader shards {read_shards} ways by {read_index}")
    calls = [
        n
        for n in ast.walk(module)
        if isinstance(n, ast.Call) and ast.unparse(n.func).endswith(".dataset_strategy")
    ]
    if not semi_auto(doc):
        return problems + (["a data-parallel tree declares a dataset strategy"] if calls else [])
    if len(calls) != 1:
        return problems + ["no dataset strategy"]
    try:
        strategy = eval(ast.unparse(calls[0].args[0]), {}, mesh)
    except NameError:
        return problems + ["the dataset strategy is not a tuple over the mesh"]
    if not isinstance(strategy, tuple) or len(strategy) != 2:
        return problems + [f"dataset strategy {strategy!r} is not one layout per input"]
    for layout in strategy:
        if tuple(layout) != (read_shards, 1):
            problems.append(f"dataset strategy {layout} but the reader shards {read_shards} ways")
    return problems


def rule_checkpoints_hold_the_ranks_own_slices(folder: Path) -> list[str]:
    """Under semi-auto parallel a rank saves and restores only the parameters MindSpore
    sliced and initialised for it: its Cell save skips `not param.sliced or
    param.has_init` (train/serialization.py, _convert_cell_param_and_names_to_dict);
    given a list, save_checkpoint would init_data() the other stages' parameters at
    full logical shape. Data-parallel and stand-alone runs save every parameter."""
    module = ast.parse((folder / "train.py").read_text())
    own = ast.unparse(function(module, "own_state"))
    problems = []
    if "p.sliced and (not p.has_init)" not in own:
        problems.append("own_state does not keep only sliced, initialised parameters")
    main = function(module, "main")
    (call,) = [v for v in assignments(main)["state"] if "own_state(" in ast.unparse(v)] or [None]
    if call is None:
        return problems + ["the state saved is not filtered"]
    want = "distributed" if semi_auto(plan_of(folder)) else "False"
    if ast.unparse(call.keywords[0].value) != want:
        problems.append(f"own_state(sliced={ast.unparse(call.keywords[0].value)}), not {want}")
    text = ast.unparse(main)
    if text.index("own_state(") > text.index("restore(") or text.index("own_state(") < text.index(
        "step_cell.compile("
    ):
        problems.append("the filter does not run between compiling and restoring")
    return problems


def rule_strategy_file_per_rank(folder: Path) -> list[str]:
    """Each semi-auto rank writes the parallel strategy file next to its checkpoints, so
    they can be merged or moved to another mesh (AutoParallel.save_param_strategy_file,
    parallel/auto_parallel.py; written when the step compiles). It must not match
    `*.ckpt`: transform_checkpoints takes the last `*.ckpt` of a rank folder as its
    checkpoint and merge_pipeline_strategys globs them (parallel/checkpoint_transform.py);
    and it records every parameter, moments included (only_trainable_params off), since
    a parameter missing from it is copied through unresharded. It is written under its
    staged name until the start is accepted (a refused --resume leaves the folder as it
    was), and that name must not match `*.ckpt` either."""
    module = ast.parse((folder / "train.py").read_text())
    main = ast.unparse(function(module, "main"))
    if not semi_auto(plan_of(folder)):
        return []
    if "step_cell.save_param_strategy_file(str(staged(folder, STRATEGY_FILE)))" not in main:
        return ["no parallel strategy file in the rank's folder"]
    names = [constant(module, "STRATEGY_FILE")]
    names.append(Path(names[0]).stem + ".partial.json")  # staged()'s name for it
    if ast.unparse(function(module, "staged")).find("{Path(name).stem}.partial.json") < 0:
        return ["the staged strategy file is not <stem>.partial.json"]
    problems = [
        f"the strategy file {name} matches *.ckpt" for name in names if fnmatch(name, "*.ckpt")
    ]
    if "step_cell.disable_strategy_file_only_for_trainable_params()" not in main:
        problems.append("the strategy file records trainable parameters only")
    return problems


def rule_lazy_inline_on_ascend(folder: Path) -> list[str]:
    """With micro-batches (pipeline or gradient accumulation) the network's __init__ is
    lazy-inlined on Ascend when distributed, on the outermost cell only
    (graph/lazy_inline.py docstring), and never on the CPU, which cannot run it."""
    doc = plan_of(folder)
    module = ast.parse((folder / "model.py").read_text())
    name = camel(doc["model"])
    decorated = {
        node.name
        for node in ast.walk(module)
        if isinstance(node, ast.ClassDef)
        for item in node.body
        if isinstance(item, ast.FunctionDef)
        and item.name == "__init__"
        and any(ast.unparse(d) == "lazy_inline_on_ascend" for d in item.decorator_list)
    }
    wanted = doc["mesh"]["pp"] > 1 or doc["micro_batches"] > 1
    if decorated - {name}:
        return [f"lazy_inline on inner cells {sorted(decorated - {name})}"]
    if wanted != (name in decorated):
        return [f"the network is {'not ' if wanted else ''}lazy-inlined"]
    if wanted:
        helper = ast.unparse(function(module, "lazy_inline_on_ascend"))
        if "ms.get_context('device_target') == 'Ascend' and GlobalComm.INITED" not in helper:
            return ["lazy_inline is not limited to distributed runs on Ascend"]
    return []


def rule_parallel_mode_follows_the_mesh(folder: Path) -> list[str]:
    """tp = pp = ep = 1 and zero = 0: MindSpore's data-parallel mode (what its CPU build runs
    under msrun) with a DistributedGradReducer averaging the gradients
    (nn/wrap/grad_reducer.py); anything else: AutoParallel semi_auto."""
    module = ast.parse((folder / "train.py").read_text())
    main = ast.unparse(function(module, "main"))
    data_parallel = (
        "parallel_mode=ms.ParallelMode.DATA_PARALLEL" in main
        and "nn.DistributedGradReducer(optimizer.parameters, mean=True, degree=DP)"
        in ast.unparse(function(module, "build"))
    )
    semi = (
        "step_cell = semi_auto(step_cell)" in main
        and "AutoParallel(cell, parallel_mode='semi_auto')" in ast.unparse(module)
    )
    want_semi = semi_auto(plan_of(folder))
    if (semi, data_parallel) != (want_semi, not want_semi):
        return [f"semi-auto {semi}, data-parallel {data_parallel}; the mesh wants semi {want_semi}"]
    return []


RULES = (
    rule_global_gradient_norm,
    rule_gradient_factor_is_a_tensor,
    rule_reducer_follows_the_mirror,
    rule_evaluation_skips_the_pipeline,
    rule_overflow_verdict_is_shared,
    rule_dataset_strategy_matches_the_reads,
    rule_checkpoints_hold_the_ranks_own_slices,
    rule_strategy_file_per_rank,
    rule_lazy_inline_on_ascend,
    rule_parallel_mode_follows_the_mesh,
)

# A plausible mistake that breaks each rule: (tree, file, text, replacement).
BREAKS = {
    rule_global_gradient_norm: (
        "gpt7b",
        "train.py",
        "ops.cast(self.reduce_sum(ops.square(g)), mstype.float32), 0",
        "ops.cast(self.reduce_sum(ops.abs(g)), mstype.float32), 0",
    ),
    rule_gradient_factor_is_a_tensor: (
        "tiny",
        "train.py",
        "self.factor = Tensor(1.0 / MICRO_BATCHES, mstype.float32)",
        "self.factor = 1.0 / MICRO_BATCHES",
    ),
    rule_reducer_follows_the_mirror: (
        "tiny_llama",
        "train.py",
        "self.from_mirror = from_mirror_of(parameters)",
        "self.from_mirror = (ZERO > 0,) * len(parameters)",
    ),
    rule_evaluation_skips_the_pipeline: (
        "tiny_dp",
        "train.py",
        "eval_cell=EvalStep(step_cell.network, distributed)",
        "eval_cell=EvalStep(Pipeline(network, MICRO_BATCHES), distributed)",
    ),
    rule_overflow_verdict_is_shared: (
        "llama13b",
        "train.py",
        "skipped = self.all_ranks(skipped)",
        "skipped = skipped",
    ),
    rule_dataset_strategy_matches_the_reads: (
        "gpt7b",
        "train.py",
        "cell.dataset_strategy(((DP, 1), (DP, 1)))",
        'cell.dataset_strategy("data_parallel")',
    ),
    rule_checkpoints_hold_the_ranks_own_slices: (
        "tiny",
        "train.py",
        "p.sliced and not p.has_init",
        "not p.has_init",
    ),
    rule_strategy_file_per_rank: (
        "llama13b",
        "train.py",
        'STRATEGY_FILE = "strategy.json"',
        'STRATEGY_FILE = "strategy.ckpt"',
    ),
    rule_lazy_inline_on_ascend: ("gpt7b", "model.py", "    @lazy_inline_on_ascend\n", ""),
    rule_parallel_mode_follows_the_mesh: (
        "tiny_dp",
        "train.py",
        "parallel_mode=ms.ParallelMode.DATA_PARALLEL",
        "parallel_mode=ms.ParallelMode.STAND_ALONE",
    ),
}


@pytest.mark.parametrize("name", TREES)
@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.__name__)
def test_every_tree_keeps_the_rule(rule, name):
    assert rule(tree(name)) == []


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.__name__)
def test_the_rule_catches_a_broken_tree(rule, tmp_path):
    name, file, text, replacement = BREAKS[rule]
    broken = shutil.copytree(tree(name), tmp_path / name)
    source = (broken / file).read_text()
    assert text in source
    (broken / file).write_text(source.replace(text, replacement))
    assert rule(broken) != []


def test_the_audit_sees_both_parallel_modes():
    modes = {semi_auto(plan_of(tree(name))) for name in TREES}
    assert modes == {True, False}


def test_an_expert_parallel_mesh_runs_semi_auto(tmp_path):
    """ep = 2 with tp = pp = 1 and zero = 0 splits the experts, which only semi-auto
    parallel's strategies do: data-parallel mode would keep every expert on every rank
    (the estimate dividing them by ep all the same), and no rank would write a
    strategy file for `msgen ckpt` to read."""
    folder = compile_spec(SPECS["tiny_moe_dp"], tmp_path, "--set", "mesh.ep=2")
    assert semi_auto(plan_of(folder))
    assert rule_parallel_mode_follows_the_mesh(folder) == []
    assert (folder / "strategy" / "stage_0.json").is_file()


# Strategies MindSpore records vs plan.json -------------------------------------------

# Where each op kind's parameters enter a primitive: param -> (primitive attribute,
# input index), and the index of the activation input of that primitive.
PARAMETER_INPUTS = {
    "linear": ({"weight": ("matmul", 1), "bias": ("add", 1)}, 0),
    "layernorm": ({"gamma": ("norm", 1), "beta": ("norm", 2)}, 0),
    "rmsnorm": ({"gamma": ("scale", 1)}, 0),
    "embedding": ({"table": ("gather", 0)}, 1),
}


def splits(axes: list[str], mesh: dict[str, int]) -> tuple[int, ...]:
    return tuple(prod(mesh[a] for a in axis.split("*")) if axis != "1" else 1 for axis in axes)


@pytest.mark.parametrize("name", TREES)
def test_recorded_strategies_are_the_plans_layouts(name):
    from mindspore.nn.utils import no_init_parameters

    folder = tree(name)
    doc = plan_of(folder)
    mesh = {k: v for k, v in doc["mesh"].items()}
    with no_init_parameters():
        network = network_class(load(folder, "model"), doc)()
    ops = {(layer, op["name"]): op for layer, ops in doc["ops"].items() for op in ops}
    checked = set()
    for path, cell in network.cells_and_names():
        parts = path.split(".")
        key = (parts[0], parts[2]) if len(parts) == 3 else ("network", parts[0])
        op = ops.get(key)
        if op is None or op["kind"] not in PARAMETER_INPUTS:
            continue
        places, activation = PARAMETER_INPUTS[op["kind"]]
        for param, split in op["params"].items():
            attr, index = places[param]
            strategy = cell._primitives[attr].attrs["in_strategy"]
            assert tuple(strategy[index]) == splits(split, mesh), (path, param)
            x = splits(op["input_splits"][0], mesh)
            if op["kind"] == "linear":  # MatMul sees x as [batch * seq, in]
                x = (prod(x[:-1]), x[-1])
            if attr != "add":
                assert tuple(strategy[activation]) == x, (path, attr)
            checked.add(f"{path}.{param}")
    owners = {(p.split(".")[0], p.split(".")[2]) if p.count(".") == 3 else ("network", p.split(".")[0]): p
              for p in (e["path"] for e in doc["params"])}  # fmt: skip
    expected = {
        p.name
        for p in network.get_parameters()
        if ops[(p.name.split(".")[0], p.name.split(".")[2]) if p.name.count(".") == 3
               else ("network", p.name.split(".")[0])]["kind"] in PARAMETER_INPUTS  # fmt: skip
    }
    assert owners and checked == expected
