"""The fused Ascend kernels: RmsNorm, Swiglu, RotaryPositionEmbedding, FlashAttentionScore.

The generated cells read the device target once, when built (model.py's
fused_kernels()), so the Ascend path is instantiated here on the CPU with MindSpore's
device_target reported as Ascend, under no_init_parameters, and nothing runs: the op
choice, each primitive and its shard strategy are read from the instantiated model.
The expected strategies are derived here from plan.json's input splits and the rules
of MindSpore's parallel ops (RmsNormInfo: x whole from the normalised dim on, gamma
whole, frontend/parallel/ops_info/rms_norm_info.cc; SwigluInfo, a Softmax over its
dim: that dim whole, ops_info/activation_info.h; rope: head_dim and the tables whole,
as mindformers shards the kernel), then held against plan.json's `fused` listing and
the strategy files.

No fused-versus-basic numerical comparison runs here: the 2.10 CPU wheel registers
no kernel for any of them (checked below), so on the CPU only the basic path runs,
and it is held to the numpy references per op in test_ops.py.
"""

from __future__ import annotations

import json
from functools import cache

import numpy as np
import pytest

from tests.emit_fixtures import ROOT, compiled, load, network_class
from tests.test_api_check import strategy_problems, trace

COMMITTED = ("llama13b", "tiny_llama")  # the committed trees with fused kernels
WHOLE4 = (1, 1, 1, 1)


def folder(name: str):
    return ROOT / "generated" / name if name in COMMITTED else compiled(name)


@cache
def build(name: str, ascend: bool):
    """The model as built on Ascend (`ascend`) or here, and its plan.json; built once."""
    import mindspore as ms
    from mindspore.nn.utils import no_init_parameters

    doc = json.loads((folder(name) / "plan.json").read_text())
    get_context = ms.get_context
    if ascend:
        ms.get_context = lambda key: "Ascend" if key == "device_target" else get_context(key)
    try:
        with no_init_parameters():
            return network_class(load(folder(name), "model"), doc)(), doc
    finally:
        ms.get_context = get_context


def factors(split: list[str], mesh: dict) -> tuple[int, ...]:
    """A plan.json split (["dp", "1", "tp"]) as slices per dim."""
    return tuple(
        int(np.prod([mesh[a] for a in axes.split("*")])) if axes != "1" else 1 for axes in split
    )


def expected(entry: dict, mesh: dict, spec_args: dict) -> dict[str, tuple]:
    """The fused kernels an op's plan.json entry should run, by primitive, with the
    strategies MindSpore's parallel ops accept, derived from its input split."""
    if entry["kind"] not in ("rmsnorm", "swiglu", "attention"):
        return {}
    x = factors(entry["input_splits"][0], mesh)
    if entry["kind"] == "rmsnorm":
        return {"RmsNorm": (x[:-1] + (1,), (1,))}
    if entry["kind"] == "swiglu":  # viewed as [..., k, 2, n / 2k]: the 2 whole
        return {"Swiglu": (x[:-1] + (x[-1], 1, 1),)}
    if entry["kind"] == "attention":
        q = (x[0], x[2], 1, 1)  # [batch, heads, rows, head_dim]
        found = {}
        if spec_args.get("rope"):
            found["RotaryPositionEmbedding"] = (q, WHOLE4, WHOLE4)
        if spec_args.get("flash"):
            found["FlashAttentionScore"] = (q, q, q) + (((1, 1),) if spec_args["causal"] else ())
        return found
    return {}


KERNEL_ATTRS = {"RmsNorm": "kernel", "Swiglu": "kernel", "RotaryPositionEmbedding": "rope_kernel"}
KERNEL_ATTRS["FlashAttentionScore"] = "attend"


def kernels_of(network) -> dict[tuple[str, str], tuple]:
    """(cell path, primitive) -> its in_strategy, for every fused kernel the model built."""
    found = {}
    for path, cell in network.cells_and_names():
        for primitive, attr in KERNEL_ATTRS.items():
            prim = cell._primitives.get(attr)
            if prim is not None and type(prim).__name__ == primitive:
                found[(path, primitive)] = prim.attrs["in_strategy"]
    return found


def op_args(name: str) -> dict[tuple[str, str], dict]:
    from tests.emit_fixtures import plan

    spec = plan(name).spec
    graphs = [*spec.layers.values(), spec.network]
    return {(g.name, n.name): n.args for g in graphs for n in g.ops}


def cell_paths(doc: dict, graph: str, op: str) -> list[str]:
    if graph == "network":
        return [op]
    return [f"{graph}.{copy}.{op}" for copy in range(doc["layers"][graph]["count"])]


@pytest.mark.parametrize("name", (*COMMITTED, "tiny_mixed"))
def test_on_ascend_each_op_runs_its_fused_kernels_with_their_strategies(name):
    network, doc = build(name, ascend=True)
    args = op_args(name)
    want = {}
    for graph, entries in doc["ops"].items():
        for entry in entries:
            kernels = expected(entry, doc["mesh"], args[(graph, entry["name"])])
            for path in cell_paths(doc, graph, entry["name"]):
                want |= {(path, p): s for p, s in kernels.items()}
            # plan.json lists the same kernels with the same strategies
            listed = {
                k["primitive"]: tuple(map(tuple, k["strategy"])) for k in entry.get("fused", ())
            }
            assert listed == kernels, (graph, entry["name"])
    assert want, "the spec has no op with a fused kernel"
    assert kernels_of(network) == want
    for path, cell in network.cells_and_names():
        kind = type(cell).__name__
        if kind in ("RMSNorm", "SwiGLU"):
            assert cell.fused
            # the basic path's primitives are not built beside the kernel
            assert not {"square", "rsqrt", "split", "silu"} & set(cell._primitives), path
        if kind == "RMSNorm":
            parts = path.split(".")
            eps = args[(parts[0], parts[-1]) if len(parts) == 3 else ("network", path)]
            assert cell.kernel.attrs["epsilon"] == pytest.approx(eps.get("eps", 1e-6))
        if kind == "Attention" and cell.rope:
            assert cell.fused_rope and not hasattr(cell, "half")
            # the 11SD tables of the BNSD layout q and k have ([batch, groups, rows, d])
            rows = cell.size * doc_seq(name)
            assert cell.cos_q.shape == (1, 1, rows, cell.head_dim)
            assert cell.sin_k.shape == (1, 1, doc_seq(name), cell.head_dim)


def doc_seq(name: str) -> int:
    from tests.emit_fixtures import plan

    return plan(name).spec.model.dims["seq"]


@pytest.mark.parametrize("name", COMMITTED)
def test_the_strategy_files_list_each_stage_s_kernels(name):
    """Each stage's strategy file names every fused kernel the cells of that stage
    hold, with the strategy its primitive carries."""
    network, doc = build(name, ascend=True)
    cells = dict(network.cells_and_names())

    def stage(path: str) -> int:  # a layer copy's, or a network op's own
        parts = path.split(".")
        return cells[".".join(parts[:2]) if len(parts) == 3 else path].pipeline_stage

    for at in range(doc["mesh"]["pp"]):
        text = (folder(name) / "strategy" / f"stage_{at}.json").read_text()
        items = json.loads(text)["parallel_strategy_item"]
        assert next(iter(items)) == "network"  # MindSpore's merge reads the first's stage
        listed = {
            tuple(key.split(" ")): tuple(map(tuple, item["parallel_strategy"]))
            for key, item in items.items()
            if key != "network"
        }
        assert all(item["stage"] == at for item in items.values())
        held = {key: s for key, s in kernels_of(network).items() if stage(key[0]) == at}
        assert listed == held, at


@pytest.mark.parametrize("name", (*COMMITTED, "tiny_mixed"))
def test_elsewhere_the_basic_path_is_built(name):
    network, _ = build(name, ascend=False)
    assert kernels_of(network) == {}
    for _, cell in network.cells_and_names():
        if type(cell).__name__ in ("RMSNorm", "SwiGLU"):
            assert not cell.fused and "kernel" not in cell._primitives
        if type(cell).__name__ == "Attention" and cell.rope:
            assert not cell.fused_rope and cell.cos_q.ndim == 2


def test_the_cpu_wheel_has_no_kernel_for_them():
    """Why no fused-versus-basic comparison runs on the CPU: MindSpore 2.10's CPU build
    has no kernel for any of them (graph mode refuses each when it selects kernels;
    PyNative fails on the first and keeps failing). Should a later wheel gain one,
    this fails, and that kernel's comparison with the basic path can run here."""
    import mindspore as ms
    from mindspore import Tensor, nn
    from mindspore.ops.auto_generate import RmsNorm, RotaryPositionEmbedding, Swiglu

    class One(nn.Cell):
        def __init__(self, prim, *args):
            super().__init__()
            self.prim = prim
            self.args = args

        def construct(self, x):
            return self.prim(x, *self.args)

    x = Tensor(np.ones((1, 1, 2, 4), np.float32))
    cells = {
        "RmsNorm": One(RmsNorm(1e-6), Tensor(np.ones(4, np.float32))),
        "Swiglu": One(Swiglu(), -1),
        "RotaryPositionEmbedding": One(RotaryPositionEmbedding(), x, x, 0),
    }
    mode = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        for name, cell in cells.items():
            with pytest.raises(RuntimeError, match=rf"Unsupported op \[{name}\] on CPU"):
                cell(x)
    finally:
        ms.set_context(mode=mode)


def test_the_strategy_check_catches_broken_fused_strategies(monkeypatch):
    """A fused kernel given a strategy MindSpore's parallel op refuses is reported by
    the shape-only trace of test_api_check: the normalised dim or gamma split, rope's
    head_dim or tables split, swiglu's halved dim split."""
    import mindspore as ms

    from tests.test_api_check import instantiate

    network = instantiate("tiny_llama", lazy=True, ascend=True, monkeypatch=monkeypatch)
    layer = network.decoder
    broken = {
        "decoder.0.n1.kernel": (layer[0].n1.kernel, ((2, 1, 2), (2,))),
        "decoder.0.n2.kernel": (layer[0].n2.kernel, ((2, 1, 1), (2,))),
        "decoder.0.att.rope_kernel": (layer[0].att.rope_kernel, ((2, 2, 1, 2), WHOLE4, WHOLE4)),
        "norm.kernel": (network.norm.kernel, ((2, 1, 1), (1,), (1,))),
    }
    for prim, strategy in broken.values():
        prim.shard(strategy)
    problems = strategy_problems(trace(network, "tiny_llama", shape_only=True), 4)
    assert {p.split(" ", 1)[0] for p in problems} == set(broken), problems

    # rope's tables laid out for a BSND x (1S1D) while q and k are BNSD
    network = instantiate("tiny_llama", lazy=True, ascend=True, monkeypatch=monkeypatch)
    att = network.decoder[1].att
    att.cos_q = ms.Tensor(np.zeros((1, att.cos_q.shape[2], 1, att.head_dim), np.float32))
    problems = strategy_problems(trace(network, "tiny_llama", shape_only=True), 4)
    assert problems and all(p.startswith("decoder.1.att.rope_kernel ") for p in problems)
    assert any("layout" in p for p in problems), problems

    network = instantiate("tiny_mixed", lazy=True, ascend=True, monkeypatch=monkeypatch)
    network.block[1].sw.kernel.shard(((4, 1, 1, 2, 1),))  # the [gate, up] dim split
    problems = strategy_problems(trace(network, "tiny_mixed", shape_only=True), 8)
    assert problems and all(p.startswith("block.1.sw.kernel ") for p in problems), problems


# The Ascend path's glue: the kernels computed by their documented definitions -------


def _rms_norm(prim, x, gamma):
    """RmsNorm's definition (its 2.10 docstring, ops/auto_generate/gen_ops_def.py)."""
    import mindspore as ms

    x, gamma = x.asnumpy(), gamma.asnumpy()
    rstd = 1 / np.sqrt((x**2).mean(-1, keepdims=True) + prim.attrs["epsilon"])
    return ms.Tensor(x * rstd * gamma), ms.Tensor(rstd)


def _swiglu(prim, x, dim=-1):
    """Swiglu's: swish of the first half along `dim` times the second half."""
    import mindspore as ms

    a, b = np.split(x.asnumpy(), 2, axis=dim)
    return ms.Tensor(a / (1 + np.exp(-a)) * b)


def _rotary(prim, x, cos, sin, mode=0):
    """RotaryPositionEmbedding's: mode 0 rotates halves (GPT-NeoX), mode 1 interleaved
    pairs (GPT-J); the tables broadcast against x in the layout their shape names."""
    import mindspore as ms

    x, cos, sin = x.asnumpy(), cos.asnumpy(), sin.asnumpy()
    if mode == 0:
        x1, x2 = np.split(x, 2, axis=-1)
        turned = np.concatenate([-x2, x1], axis=-1)
    else:
        turned = np.stack([-x[..., 1::2], x[..., 0::2]], axis=-1).reshape(x.shape)
    return ms.Tensor(x * cos + turned * sin)


DEFINED = {"RmsNorm": _rms_norm, "Swiglu": _swiglu, "RotaryPositionEmbedding": _rotary}


@pytest.fixture
def defined_kernels(monkeypatch):
    """The fused primitives computed by their documented definitions (numpy), since the
    CPU has no kernel for them: what the Ascend path's own code around them does (views,
    table layouts, casts, the dim and mode it passes) then runs for real."""
    from mindspore.ops import auto_generate

    for name, rule in DEFINED.items():
        monkeypatch.setattr(getattr(auto_generate, name), "__call__", rule)


def test_the_ascend_path_computes_what_the_basic_path_does(defined_kernels):
    """tiny_llama's loss with its norms and rope on the fused path equals the basic
    path's, the same weights and tokens (forward; the definitions have no backward)."""
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE)
    doc = json.loads((folder("tiny_llama") / "plan.json").read_text())
    model = load(folder("tiny_llama"), "model")
    basic = network_class(model, doc)()
    get_context = ms.get_context
    ms.get_context = lambda key: "Ascend" if key == "device_target" else get_context(key)
    try:
        fused = network_class(model, doc)()
    finally:
        ms.get_context = get_context
    assert len(kernels_of(fused)) == 2 * 3 + 1  # n1, att, n2 per copy; the final norm
    rng = np.random.default_rng(0)
    weights = {
        p.name: rng.normal(0, 0.5, p.shape).astype(np.float32) for p in basic.get_parameters()
    }
    for net in (basic, fused):
        net.set_train(False)
        for p in net.get_parameters():
            p.set_data(ms.Tensor(weights[p.name]))
    ids = rng.integers(0, 256, (2, 33), np.int32)
    tokens, labels = ms.Tensor(ids[:, :-1]), ms.Tensor(ids[:, 1:])
    want = basic(tokens, labels).asnumpy()
    assert fused(tokens, labels).asnumpy() == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("slices", (1, 2))
def test_the_fused_swiglu_halves_each_slice(defined_kernels, slices):
    """tiny_mixed's SwiGLU cell, fused and basic, against the per-slice definition: a
    last dim split k ways holds [gate | up] of each slice (the weight laid out per shard)."""
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE)
    cell_class = load(compiled("tiny_mixed"), "model").SwiGLU
    view = ((1, 1, slices, 1, 1),)
    basic = cell_class(view)
    get_context = ms.get_context
    ms.get_context = lambda key: "Ascend" if key == "device_target" else get_context(key)
    try:
        fused = cell_class(view)
    finally:
        ms.get_context = get_context
    assert fused.fused and not basic.fused
    x = np.random.default_rng(1).normal(size=(2, 3, 16)).astype(np.float32)
    gate, up = (x.reshape(2, 3, slices, 2, 8 // slices)[..., i, :] for i in (0, 1))
    want = (gate / (1 + np.exp(-gate)) * up).reshape(2, 3, 8)
    for cell in (basic, fused):
        np.testing.assert_allclose(cell(ms.Tensor(x)).asnumpy(), want, rtol=1e-5, atol=1e-6)


def test_msgen_diff_shows_a_kernel_the_change_brings(tmp_path):
    """Turning rope on in tiny_llama adds RotaryPositionEmbedding to the attention's
    fused kernels, and `msgen diff` says so with its strategy."""
    import shutil

    from msgen.review.command import DiffOptions, diff_report

    spec = ROOT / "specs" / "tiny_llama.msl"
    shutil.copy(spec.parent / "hccn.conf", tmp_path / "hccn.conf")
    (tmp_path / "new.msl").write_text(spec.read_text())
    (tmp_path / "old.msl").write_text(spec.read_text().replace("rope = true", "rope = false"))
    report = diff_report(DiffOptions(tmp_path / "new.msl", tmp_path / "old.msl"))
    fused = [c for c in report.ops if c.aspect == "fused"]
    assert [(c.graph, c.op, c.old) for c in fused] == [("decoder", "att", None)]
    assert fused[0].new == "RotaryPositionEmbedding ((2, 2, 1, 1), (1, 1, 1, 1), (1, 1, 1, 1))"
