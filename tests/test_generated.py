"""The compiled specs' model.py, instantiated in MindSpore (CPU), against plan.json and an
independent numpy forward pass (tests/reference_numpy.py, over each op's reference in
tests/test_op_*.py, written from the IR).

- Every parameter's name and logical shape is what plan.json lists, the total is
  its `params_total` and the estimate's; layer copies sit on their pipeline stages
  and parameters carry their fusion ids. gpt7b and llama13b are instantiated under
  `no_init_parameters` (nothing allocated), and their constant tables are shared
  by the layers instead of copied into each.
- The forward loss equals the numpy reference on the same (large, random) weights.
- Compiling is byte-for-byte deterministic whatever PYTHONHASHSEED, for every spec.
- Op names the generated cells cannot carry are rejected by `check`, or work.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from math import prod
from pathlib import Path

import numpy as np
import pytest

from tests import reference_numpy as ref
from tests import test_op_attention
from tests.emit_fixtures import (
    BIG,
    ROOT,
    SPECS,
    TINY,
    compile_spec,
    compiled,
    copy_placement,
    every_param,
    load,
    network_class,
    plan,
    plan_json,
)

REFERENCE_STD = 0.5  # large enough that every op moves the loss (0.02 at init)


def build(name: str, *, lazy: bool = False):
    """The network cell of the compiled spec `name`; `lazy`: under no_init_parameters."""
    from mindspore.nn.utils import no_init_parameters

    cls = network_class(load(compiled(name), "model"), plan_json(name))
    if not lazy:
        return cls()
    with no_init_parameters():
        return cls()


def check_against_plan(network, doc: dict) -> None:
    got = {p.name: tuple(p.shape) for p in network.get_parameters()}
    want = {e["path"]: tuple(e["shape"]) for e in every_param(doc)}
    assert sorted(got) == sorted(want)
    assert got == want
    total = sum(prod(shape) for shape in got.values())
    assert total == doc["params_total"] == doc["estimate"]["params_total"]
    # Each parameter's gradient fusion group, as plan.json lists it (1: MindSpore's default).
    fusion = {p.name: p.comm_fusion for p in network.get_parameters()}
    assert fusion == {e["path"]: e["fusion_id"] for e in every_param(doc)}
    # Every copy of a repeated layer sits on its stage (interleaved: and its segment, the
    # model chunk of that stage); network cells with parameters too.
    cells = dict(network.cells_and_names())
    if doc["mesh"]["pp"] > 1:
        for layer, info in doc["layers"].items():
            stages = [cells[f"{layer}.{i}"].pipeline_stage for i in range(info["count"])]
            assert stages == copy_placement(info, "stage"), layer
            if doc["chunks"] > 1:
                segments = [cells[f"{layer}.{i}"].pipeline_segment for i in range(info["count"])]
                assert segments == copy_placement(info, "segment"), layer
            else:
                assert all("segment" not in run for run in info["placement"])
        for e in every_param(doc):
            owner = e["path"].rsplit(".", 1)[0]
            if owner in cells and owner.split(".")[0] not in doc["layers"]:
                assert cells[owner].pipeline_stage == e["stages"][0], e["path"]


@pytest.mark.parametrize("name", TINY)
def test_parameters_are_the_plan_params(name):
    check_against_plan(build(name), plan_json(name))


@pytest.mark.parametrize("name", BIG)
def test_big_model_parameters_without_allocating(name):
    network = build(name, lazy=True)
    check_against_plan(network, plan_json(name))
    # The attention constants (causal mask, rope tables) are built once, not per layer:
    # llama13b's composed-path mask alone is 5 * 4096 * 4096 fp32 = 335 MB.
    attention = [
        cell for _, cell in network.cells_and_names() if type(cell).__name__ == "Attention"
    ]
    assert len(attention) == plan_json(name)["layers"]["decoder"]["count"]
    for attr in ("mask", "cos_q", "sin_q", "cos_k", "sin_k"):
        found = {id(getattr(cell, attr)) for cell in attention if hasattr(cell, attr)}
        assert len(found) <= 1, attr


def test_interleaved_layers_run_on_their_virtual_stages():
    """tiny_interleaved: 4 layers, pp = 2, interleaved(chunks = 2). Virtual stage v =
    g // (layers / (pp * chunks)) of copy g runs on stage v % pp as segment v // pp, in
    plan.json, in the instantiated network, and in what train.py asks MindSpore for."""
    doc = plan_json("tiny_interleaved")
    assert (doc["schedule"], doc["chunks"], doc["stage_split"]) == ("interleaved", 2, [2, 2])
    assert copy_placement(doc["layers"]["block"], "stage") == [0, 1, 0, 1]
    assert copy_placement(doc["layers"]["block"], "segment") == [0, 0, 1, 1]
    stages = {e["path"]: e["stages"] for e in every_param(doc)}
    assert stages["block.2.qkv.weight"] == [0] and stages["block.3.qkv.weight"] == [1]
    assert stages["emb.table"] == [0, 1]  # tied: the embedding and the output layer
    estimate = {s["stage"]: s["layers"] for s in doc["estimate"]["stages"]}
    assert estimate == {0: 2, 1: 2}
    network = build("tiny_interleaved", lazy=True)
    cells = dict(network.cells_and_names())
    placed = [(cells[f"block.{i}"].pipeline_stage, cells[f"block.{i}"].pipeline_segment)
              for i in range(4)]  # fmt: skip
    assert placed == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert (cells["emb"].pipeline_stage, cells["emb"].pipeline_segment) == (0, 0)
    assert (cells["output"].pipeline_stage, cells["output"].pipeline_segment) == (1, 1)
    train = (compiled("tiny_interleaved") / "train.py").read_text()
    assert 'cell.pipeline(stages=PP, interleave=True, scheduler="1f1b")' in train
    for name in ("tiny", "tiny_llama"):  # plain 1F1B elsewhere
        text = (compiled(name) / "train.py").read_text()
        assert 'cell.pipeline(stages=PP, scheduler="1f1b")' in text
        assert "pipeline_segment" not in (compiled(name) / "model.py").read_text()


def test_the_network_is_lazy_inlined_when_distributed_on_ascend_only(monkeypatch):
    """With micro-batches the step's graph unrolls the network once per micro-batch;
    `@lazy_inline` on the outermost cell compiles it once (graph/lazy_inline.py). The
    CPU backend cannot run it, and a stand-alone run does without, so the generated
    network applies it on Ascend with communication initialised only."""
    import mindspore as ms
    from mindspore.communication import GlobalComm

    def inlined(name):
        network = build(name, lazy=True)
        assert not any(hasattr(cell, "cell_init_args") for _, cell in network.cells_and_names()
                       if cell is not network)  # fmt: skip
        return getattr(network, "cell_init_args", "").startswith("lazy_inline_")

    assert not inlined("tiny_interleaved")
    get_context = ms.get_context
    monkeypatch.setattr(
        ms, "get_context", lambda key: "Ascend" if key == "device_target" else get_context(key)
    )
    assert not inlined("tiny_interleaved")  # stand-alone
    monkeypatch.setattr(GlobalComm, "INITED", True)
    for name in ("tiny", "tiny_interleaved", "tiny_llama"):  # every schedule
        assert inlined(name), name


def pipeline_call(train_py: str) -> dict:
    """The keyword arguments of train.py's `cell.pipeline(...)` (in semi_auto())."""
    import ast

    (call,) = [
        node
        for node in ast.walk(ast.parse(train_py))
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "cell.pipeline"
    ]
    return {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg != "stages"}


def test_mindspore_takes_each_schedules_pipeline_config(tmp_path):
    """What train.py asks AutoParallel.pipeline for becomes MindSpore's pipeline_config,
    which 2.10 validates: gpipe runs only with interleave on (it is refused without)."""
    import mindspore as ms

    gpipe = compile_spec(SPECS["tiny"], tmp_path, "--set", "pipeline.schedule=gpipe")
    folders = {
        "1f1b": compiled("tiny"),
        "interleaved": compiled("tiny_interleaved"),
        "gpipe": gpipe,
    }
    expected = {
        "1f1b": {"scheduler": "1f1b"},
        "interleaved": {"interleave": True, "scheduler": "1f1b"},
        "gpipe": {"interleave": True, "scheduler": "gpipe"},
    }
    for schedule, folder in folders.items():
        kwargs = pipeline_call((folder / "train.py").read_text())
        assert kwargs == expected[schedule], schedule
        config = {
            "pipeline_interleave": kwargs.get("interleave", False),
            "pipeline_scheduler": kwargs["scheduler"],
        }
        try:
            ms.set_auto_parallel_context(pipeline_stages=2, pipeline_config=config)
        finally:
            ms.reset_auto_parallel_context()
        # Every schedule compiles the network once on Ascend.
        assert "@lazy_inline_on_ascend" in (folder / "model.py").read_text(), schedule
    with pytest.raises(TypeError, match="only '1f1b' is allowed"):
        config = {"pipeline_interleave": False, "pipeline_scheduler": "gpipe"}
        try:
            ms.set_auto_parallel_context(pipeline_stages=2, pipeline_config=config)
        finally:
            ms.reset_auto_parallel_context()


def test_model_py_does_not_grow_with_the_layers(tmp_path):
    """Pipeline placement and fusion ids are runs of copies (one per virtual stage, one
    per fusion bucket), not one entry per copy: 64 layers make the same model.py as 4
    but for the numbers in it, and so does plan.json."""
    sizes, plan_sizes = {}, {}
    for layers in (4, 64):
        out = tmp_path / str(layers)
        folder = compile_spec(SPECS["tiny_interleaved"], out, "--set", f"model.layers={layers}")
        sizes[layers] = len((folder / "model.py").read_bytes())
        doc = json.loads((folder / "plan.json").read_text())
        assert len(copy_placement(doc["layers"]["block"], "segment")) == layers
        plan_sizes[layers] = len((folder / "plan.json").read_bytes())
        network = network_class(load(folder, "model"), doc)
        from mindspore.nn.utils import no_init_parameters

        with no_init_parameters():
            check_against_plan(network(), doc)
    assert abs(sizes[64] - sizes[4]) < 100, sizes
    assert abs(plan_sizes[64] - plan_sizes[4]) < 300, plan_sizes


def test_instantiating_llama13b_stays_small():
    """A fresh process instantiates llama13b (13e9 parameters, 40 layers of rope tables and
    causal masks) without allocating parameters: RSS stays under 3 GB, time under 30 s."""
    folder = compiled("llama13b")
    code = (
        "import resource, sys\n"
        f"sys.path.insert(0, {str(folder)!r})\n"
        "from mindspore.nn.utils import no_init_parameters\n"
        "import model\n"
        "with no_init_parameters():\n"
        "    net = model.Llama13b()\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "GLOG_v": "3"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    peak_kib = int(out.stdout.split()[-1])
    assert peak_kib < 3 * 2**20, f"peak RSS {peak_kib / 2**20:.1f} GiB"


# numpy reference ----------------------------------------------------------------------


def randomised(name: str, seed: int = 0):
    """The network in evaluation mode (dropout off), weights drawn with REFERENCE_STD."""
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE)
    network = build(name)
    network.set_train(False)
    rng = np.random.default_rng(seed)
    for p in network.get_parameters():
        p.set_data(ms.Tensor(rng.normal(0.0, REFERENCE_STD, p.shape).astype(np.float32)))
    return network, rng


def batch(name: str, rng, rows: int):
    """`rows` random sequences: tokens and their next-token labels."""
    dims = plan(name).spec.model.dims
    ids = rng.integers(0, dims["vocab"], (rows, dims["seq"] + 1), np.int32)
    return ids[:, :-1], ids[:, 1:]


def mindspore_loss(network, tokens, labels) -> float:
    import mindspore as ms

    return float(network(ms.Tensor(tokens), ms.Tensor(labels)).asnumpy())


@pytest.fixture(scope="module")
def forward():
    """Per tiny spec: (MindSpore loss, parameters by path, tokens, labels)."""
    out = {}
    for name in TINY:
        network, rng = randomised(name)
        tokens, labels = batch(name, rng, rows=2)
        params = {p.name: p.asnumpy() for p in network.get_parameters()}
        out[name] = (mindspore_loss(network, tokens, labels), params, tokens, labels)
    return out


@pytest.mark.parametrize("name", TINY)
def test_forward_matches_the_numpy_reference(forward, name):
    loss, params, tokens, labels = forward[name]
    expected = ref.forward_loss(plan(name), params, tokens, labels)
    assert abs(loss - expected) <= 1e-4 * max(1.0, abs(expected)), (loss, expected)
    assert loss > 1.3 * np.log(256)  # the large weights take the loss far from uniform
    if name == "tiny":  # its output layer is tied: no weight of its own, emb.table read twice
        assert not any(path.startswith("logits.") for path in params)


def wrong_groups(attention, qkv, heads, groups, hd, causal, use_rope):
    """`attention` with query head h on kv group h % groups instead of h // (heads / groups):
    the heads are moved to where the reference reads that group, and moved back after."""
    b, s, _ = qkv.shape
    per = heads // groups
    t = qkv.reshape(b, s, groups, per + 2, hd)
    q = t[:, :, :, :per].reshape(b, s, heads, hd)
    place = [(h % groups) * per + h // groups for h in range(heads)]  # head -> slot
    slots = np.empty_like(q)
    slots[:, :, place] = q
    t = np.concatenate([slots.reshape(b, s, groups, per, hd), t[:, :, :, per:]], axis=3)
    out = attention(t.reshape(b, s, -1), heads, groups, hd, causal, use_rope)
    return out.reshape(b, s, heads, hd)[:, :, place].reshape(b, s, heads * hd)


@pytest.mark.parametrize(
    "name, change",
    [
        ("tiny", "causal"),
        ("tiny_llama", "causal"),
        ("tiny_llama", "rope"),
        ("tiny_llama", "groups"),
        ("tiny_mixed", "rope"),
        ("tiny_mixed", "rope_theta"),
        ("tiny_mixed", "window"),
        ("tiny_mixed", "qk_norm"),
        ("tiny_mixed", "rope_scaling"),
    ],
)
def test_the_reference_comparison_sees_each_feature(forward, monkeypatch, name, change):
    """The comparison above is not vacuous: the reference with one attention feature
    changed (no causal mask, no rope, rope's default base, no rope scaling, no sliding
    window, no q/k norms, query heads given to the wrong kv group) is far from MindSpore's loss."""
    loss, params, tokens, labels = forward[name]
    attention = test_op_attention.attention

    def altered(qkv, heads, groups, hd, causal, use_rope, theta, window, qk=None, scaling=None):
        if change == "causal":
            causal = not causal
        elif change == "rope":
            use_rope = not use_rope
        elif change == "rope_theta":
            theta = 10000.0
        elif change == "window":
            window = None
        elif change == "qk_norm":
            qk = None
        elif change == "rope_scaling":
            scaling = None
        else:
            return wrong_groups(attention, qkv, heads, groups, hd, causal, use_rope)
        return attention(qkv, heads, groups, hd, causal, use_rope, theta, window, qk, scaling)

    monkeypatch.setattr(test_op_attention, "attention", altered)
    expected = ref.forward_loss(plan(name), params, tokens, labels)
    assert abs(loss - expected) > 1e-2, (change, loss, expected)


# determinism ---------------------------------------------------------------------------


def all_specs() -> list[Path]:
    return sorted(
        {
            *(ROOT / "specs").glob("*.msl"),
            *(ROOT / "specs" / "validation").glob("*.msl"),
            *(ROOT / "tests" / "specs").glob("*.msl"),
        }
    )


COMPILE_ALL = """
import contextlib, io, json, sys
from msgen.cli import main
status = {}
for spec in sys.argv[2:]:
    with contextlib.redirect_stderr(io.StringIO()):
        status[spec] = main(["compile", spec, "-o", sys.argv[1] + "/" + spec.replace("/", "_")])
print(json.dumps(status))
"""


def test_every_spec_compiles_to_the_same_bytes_whatever_the_hash_seed(tmp_path):
    specs = [p.relative_to(ROOT).as_posix() for p in all_specs()]
    trees, statuses = [], []
    for seed in ("0", "4242"):
        out = tmp_path / f"seed{seed}"
        run = subprocess.run(
            [sys.executable, "-c", COMPILE_ALL, str(out), *specs],
            cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        statuses.append(json.loads(run.stdout.splitlines()[-1]))
        trees.append(
            {
                p.relative_to(out).as_posix(): p.read_bytes()
                for p in sorted(out.rglob("*"))
                if p.is_file()
            }
        )
    assert statuses[0] == statuses[1]
    # Every spec compiles, but the validation specs that are over their budget.
    assert {s for s, code in statuses[0].items() if code != 0} <= {
        "specs/validation/korthikanti22b.msl",
        "specs/validation/llama2_7b_mindformers.msl",
        "specs/validation/llama2_13b_mindformers.msl",
        "specs/validation/mixtral_8x7b_mindspeed.msl",
    }
    assert trees[0] == trees[1]
    for spec, code in statuses[0].items():
        if code == 0:
            assert any(path.startswith(spec.replace("/", "_") + "/") for path in trees[0]), spec


# op names ------------------------------------------------------------------------------

# Renamings of specs/tiny.msl: (what, old text, new text).
CLASHES = {
    # An op named after an nn.Cell attribute would replace it (self.training = ...).
    "training": (
        "    act  = gelu(up)\n    down = linear(act,",
        "    training = gelu(up)\n    down = linear(training,",
    ),
    "cells": (
        "    norm   = layernorm(body)\n    logits = linear(norm,",
        "    cells  = layernorm(body)\n    logits = linear(cells,",
    ),
    "construct": (
        "    act  = gelu(up)\n    down = linear(act,",
        "    construct = gelu(up)\n    down = linear(construct,",
    ),
    "set_train": (
        "    act  = gelu(up)\n    down = linear(act,",
        "    set_train = gelu(up)\n    down = linear(set_train,",
    ),
    # The network's construct takes `labels`; a layer's construct is a method (`self`).
    "labels": (
        "    norm   = layernorm(body)\n    logits = linear(norm,",
        "    labels = layernorm(body)\n    logits = linear(labels,",
    ),
    "self": (
        "    act  = gelu(up)\n    down = linear(act,",
        "    self = gelu(up)\n    down = linear(self,",
    ),
    "class": (
        "    act  = gelu(up)\n    down = linear(act,",
        "    class = gelu(up)\n    down = linear(class,",
    ),
    # The network's construct runs the repeated layers as `for cell in self.<layer>:`,
    # so an op named `cell` whose value is used after the loop reads the last layer.
    "cell": (
        "    x      = emb + pos\n    body   = repeat decoder(x) layers\n    norm   = layernorm(body)",
        "    cell   = emb + pos\n    body   = repeat decoder(cell) layers\n"
        "    mix    = body + cell\n    norm   = layernorm(mix)",
    ),
    # A network op named like a repeated layer replaces its CellList (self.decoder = ...).
    "decoder": (
        "    norm   = layernorm(body)\n    logits = linear(norm,",
        "    decoder = layernorm(body)\n    logits = linear(decoder,",
    ),
    # Harmless: a plain name, for contrast.
    "act2": (
        "    act  = gelu(up)\n    down = linear(act,",
        "    act2 = gelu(up)\n    down = linear(act2,",
    ),
}


# Names `check` does not reject yet although the generated model breaks on them; remove
# one from here when msgen/checks/names.py rejects it (the test then passes strictly).
@pytest.mark.parametrize("name", CLASHES)
def test_an_op_name_is_rejected_or_works(tmp_path, name):
    """Each renaming of a tiny op is either an error of `msgen check`, or compiles to
    a model whose parameters are plan.json's and whose loss is the reference's."""
    import mindspore as ms

    from msgen.analysis.plan import build_plan
    from msgen.compiler import analyze

    old, new = CLASHES[name]
    text = (ROOT / "specs" / "tiny.msl").read_text()
    assert text.count(old) == 1
    spec = tmp_path / "tiny.msl"
    spec.write_text(text.replace(old, new))
    shutil.copy(ROOT / "specs" / "hccn.conf", tmp_path)
    result = analyze(spec)
    if not result.ok:
        assert any(d.code == "MSL125" for d in result.diagnostics), [
            d.message for d in result.diagnostics
        ]
        return
    folder = compile_spec(spec, tmp_path / "out")
    doc = json.loads((folder / "plan.json").read_text())
    ms.set_context(mode=ms.PYNATIVE_MODE)
    network = network_class(load(folder, "model"), doc)()
    assert {p.name: list(p.shape) for p in network.get_parameters()} == {
        e["path"]: e["shape"] for e in every_param(doc)
    }
    network.set_train(False)
    rng = np.random.default_rng(0)
    for p in network.get_parameters():
        p.set_data(ms.Tensor(rng.normal(0.0, REFERENCE_STD, p.shape).astype(np.float32)))
    tokens, labels = batch("tiny", rng, rows=2)
    loss = mindspore_loss(network, tokens, labels)
    params = {p.name: p.asnumpy() for p in network.get_parameters()}
    expected = ref.forward_loss(build_plan(result.spec, result.facts), params, tokens, labels)
    assert abs(loss - expected) <= 1e-4 * max(1.0, abs(expected))
    network.set_train(True)  # the dropout branch runs too
    assert np.isfinite(mindspore_loss(network, tokens, labels))


def test_reserved_cell_attributes_are_mindspores():
    """msgen/checks/reserved.py keeps nn.Cell's public attributes as a static list (msgen
    never imports mindspore); it must be exactly the installed MindSpore's."""
    from mindspore import nn

    from msgen.checks.reserved import CELL_ATTRIBUTES

    public = {n for n in {*dir(nn.Cell), *vars(nn.Cell())} if not n.startswith("_")}
    assert sorted(CELL_ATTRIBUTES) == sorted(public)


def test_specs_cover_the_op_kinds():
    """Between them the compiled test specs use every op kind and both tie modes."""
    from msgen.ops import OPS

    kinds = set()
    # tiny_moe's and tiny_mla's code is run by tests/test_moe_code.py and test_mla_code.py
    for name in (*TINY, "tiny_moe", "tiny_mla"):
        doc = plan_json(name)
        kinds |= {op["kind"] for ops in doc["ops"].values() for op in ops}
    assert set(OPS) - kinds <= {"repeat"}, set(OPS) - kinds
    assert re.search(r"tie *= *emb", SPECS["tiny"].read_text())
