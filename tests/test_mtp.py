"""Multi-token prediction (`train.mtp`, msgen/analysis/mtp.py, templates/ops/mtp.py.j2):
the generated loss against a numpy forward written from DeepSeek-V3's definition
(arXiv 2412.19437, section 2.2, equations 21-25), MTP off against the main loss, the
parameters the estimate counts, and the module on the last pipeline stage.

The reference runs each module on the truncated sequence the paper writes: module k
sees positions 1 .. T - k, the hidden state of the previous depth there and the
embedding of the token k ahead, and predicts the token k + 1 ahead; attention is
causal, so the truncation is all the masking there is. Each module's loss is the mean
over its T - k positions (Megatron-LM's and mindformers' loss-mask normalisation; the
paper divides by T), and the loss is L_main + weight / D * sum_k L_k (equation 25).
The concatenation is [enorm(embedding); hnorm(h)], as the released checkpoint,
Megatron-LM and mindformers order it. The main model's forward and the block are the
repository's numpy reference of msgen's IR (tests/reference_numpy.py), not the
generated code.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest

from tests import reference_numpy as ref
from tests.emit_fixtures import SPECS, compile_spec, load, network_class
from tests.test_op_loss import cross_entropy
from tests.test_op_norm import rmsnorm

SPEC = SPECS["tiny_mtp"]
EPS = 1e-6  # rmsnorm's default (the spec's final norm writes none)
STD = 0.5  # weights large enough that every part moves the loss


def variant(tmp_path: Path, name: str, line: str, spec: Path = SPEC, **replace: str) -> Path:
    """A spec (tiny_mtp.msl) with its mtp line replaced by `line` (and any other text
    replaced)."""
    text = spec.read_text()
    assert text.count("    mtp          = mtp(depth = 1, weight = 0.3)") == 1
    text = text.replace("    mtp          = mtp(depth = 1, weight = 0.3)", "    " + line)
    for old, new in replace.items():
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / f"{name}.msl"
    path.write_text(text)
    return path


def analysed(spec: Path):
    from msgen.analysis.plan import build_plan
    from msgen.compiler import analyze

    result = analyze(spec)
    assert result.ok, [d.message for d in result.diagnostics]
    return build_plan(result.spec, result.facts)


def network_of(spec: Path, out: Path, seed: int = 0):
    """The compiled network (PyNative, evaluation mode) with every trained weight drawn
    from N(0, STD): norms not ones, so a swapped or missing norm shows."""
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE)
    folder = compile_spec(spec, out)
    model = load(folder, "model")
    network = network_class(model, {"model": folder.name})()
    network.set_train(False)
    rng = np.random.default_rng(seed)
    for p in network.trainable_params():
        p.set_data(ms.Tensor(rng.normal(0.0, STD, p.shape).astype(np.float32)))
    return network, folder


def tokens_and_labels(seed: int = 1, rows: int = 2, seq: int = 32, vocab: int = 256):
    ids = np.random.default_rng(seed).integers(0, vocab, (rows, seq + 1), np.int32)
    return ids[:, :-1], ids[:, 1:]


class Module(NamedTuple):
    """One module's own weights as the paper names them, and its block as a function."""

    enorm: np.ndarray  # [hidden]
    hnorm: np.ndarray  # [hidden]
    eh_proj: np.ndarray  # [2 hidden, hidden]: x @ eh_proj, the embedding's half first
    block: Callable[[np.ndarray], np.ndarray]
    norm: np.ndarray  # [hidden]: shared_head.norm


def module_losses(h, full, table, head, modules: list[Module], eps: float = EPS) -> list:
    """Each module's loss L_k (equations 21-24), from h^0 [batch, T, hidden] (what the
    output layer reads), the tokens t_0 .. t_T [batch, T + 1], the shared embedding
    table [vocab, hidden] and output weight [hidden, vocab]."""
    seq = full.shape[1] - 1
    losses = []
    for k, mod in enumerate(modules, 1):
        n = seq - k  # positions 0 .. T - k - 1 have a token k + 1 ahead
        embedded = table[full[:, k : k + n]]  # Emb(t_{i+k})
        joined = np.concatenate(
            [rmsnorm(embedded, mod.enorm, eps), rmsnorm(h[:, :n], mod.hnorm, eps)], axis=-1
        )
        h = mod.block(joined @ mod.eh_proj)
        logits = rmsnorm(h, mod.norm, eps) @ head
        losses.append(cross_entropy(logits, full[:, k + 1 : k + 1 + n]))
    return losses


def reference_loss(plan, params: dict, tokens, labels, depth: int, weight: float):
    """L_main + weight / depth * sum over modules k = 1 .. depth of L_k, in float64, plus
    the auxiliary losses of the main layers and of the modules' blocks; and the modules'
    mean loss (log.csv's mtp_loss)."""
    from msgen.analysis.facts import context

    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    ctx, aux = context(plan.spec), []
    main = ref.forward_loss(plan, params, tokens, labels)  # its layers' aux included
    h = p["emb.table"][tokens]
    for rep in plan.repeats:
        for i in range(rep.count):
            h = ref.run_graph(plan, rep.layer, h, p, f"{rep.layer}.{i}.", None, ctx, [])
    h = rmsnorm(h, p["norm.gamma"], EPS)  # h^0: what the output layer reads

    def module(k: int) -> Module:
        m = f"mtp.layers.{k}."
        layer = plan.mtp.setting.layer

        def block(x):
            return ref.run_graph(plan, layer, x, p, m + "block.", None, ctx, aux)

        return Module(p[m + "enorm.gamma"], p[m + "hnorm.gamma"], p[m + "eh_proj.weight"],
                      block, p[m + "norm.gamma"])  # fmt: skip

    full = np.concatenate([tokens, labels[:, -1:]], axis=1)  # t_0 .. t_T
    modules = [module(k) for k in range(depth)]
    losses = module_losses(h, full, p["emb.table"], p["logits.weight"], modules)
    mean = sum(losses) / depth
    return main + weight * mean + sum(aux), mean


@pytest.mark.parametrize(
    "spec, depth, weight, replace",
    [
        ("tiny_mtp", 1, 0.3, {}),
        ("tiny_mtp", 2, 0.5, {}),
        # the block is a moe layer whose auxiliary loss joins the loss
        ("tiny_mtp_moe", 1, 0.3, {"shared_ffn = expert)": "shared_ffn = expert, aux_loss = 0.1)"}),
    ],
)
def test_the_loss_equals_the_numpy_reference_of_the_modules(tmp_path, spec, depth, weight, replace):
    line = f"mtp = mtp(depth = {depth}, weight = {weight})"
    spec = variant(tmp_path, f"d{depth}", line, SPECS[spec], **replace)
    network, _ = network_of(spec, tmp_path / "out")
    tokens, labels = tokens_and_labels()
    import mindspore as ms

    loss = float(network(ms.Tensor(tokens), ms.Tensor(labels)).asnumpy())
    params = {p.name: p.asnumpy() for p in network.trainable_params()}
    plan = analysed(spec)
    own = len(plan.mtp.own_params(plan.facts))  # 4 of its own and the block's
    assert sum(name.startswith("mtp.layers.") for name in params) == depth * own
    expected, mtp_loss = reference_loss(plan, params, tokens, labels, depth, weight)
    main = ref.forward_loss(plan, params, tokens, labels)
    # fp32 against float64: 3e-7 relative as measured; one position left unmasked at
    # depth 1 is 5e-5
    assert abs(loss - expected) <= 1e-5 * abs(expected), (loss, expected, main)
    assert abs(expected - main) > 1e3 * 1e-5 * abs(expected)  # the modules move the loss
    # the log's term: the modules' mean loss, summed into `total` by the forward
    assert float(network.mtp.total.asnumpy()) == pytest.approx(mtp_loss, rel=1e-5)


def test_mtp_off_is_exactly_the_main_loss(tmp_path):
    """`mtp = none` compiles the model without the modules, byte for byte as a spec
    without the line; with the modules' weight 0 the loss is that model's, bit for bit
    (the same main network, the same weights, plus exactly 0)."""
    off = variant(tmp_path, "off", "mtp = none")
    absent = variant(tmp_path, "absent", "")
    off_net, off_folder = network_of(off, tmp_path / "off")
    absent_folder = compile_spec(absent, tmp_path / "absent")
    body = [(f / "model.py").read_text().split("\n", 2)[2] for f in (off_folder, absent_folder)]
    assert body[0] == body[1] and "MultiTokenPrediction" not in body[0]
    zero = variant(tmp_path, "zero", "mtp = mtp(depth = 1, weight = 0.0)")
    on_net, _ = network_of(zero, tmp_path / "zero")
    import mindspore as ms

    shared = {p.name: p for p in on_net.trainable_params()}
    for p in off_net.trainable_params():
        p.set_data(shared[p.name].value())
    tokens, labels = tokens_and_labels()
    off_loss = off_net(ms.Tensor(tokens), ms.Tensor(labels)).asnumpy()
    on_loss = on_net(ms.Tensor(tokens), ms.Tensor(labels)).asnumpy()
    assert off_loss.tobytes() == on_loss.tobytes()
    assert float(on_net.mtp.total.asnumpy()) > 1.0  # the modules ran, weighted by 0


def test_params_mtp_by_hand(tmp_path):
    """tiny_mtp: hidden h = 64, ffn 128, 4 heads of 16 over 2 kv heads, vocab 256.
    One module's own parameters: enorm, hnorm, norm gammas 3 x 64 = 192; eh_proj
    [2h, h] = 128 x 64 = 8,192; the block: two rmsnorm gammas 128, qkv 64 x (4 + 2 x 2)
    x 16 = 8,192, o 64 x 64 = 4,096, gate, up, down 3 x 64 x 128 = 24,576, together
    36,992. Module: 192 + 8,192 + 36,992 = 45,376. The main model: 2 x 36,992 + emb
    256 x 64 + norm 64 + logits 64 x 256 = 106,816; params_total 152,192 with the
    module. Depth 2: twice the module's."""
    from msgen.cli import main

    for depth, mtp in ((1, 45_376), (2, 90_752)):
        spec = variant(tmp_path, f"d{depth}", f"mtp = mtp(depth = {depth})")
        plan = analysed(spec)
        assert plan.params_mtp == mtp
        assert plan.params_total == 106_816 + mtp
    import contextlib
    import io
    import json

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["estimate", str(SPEC), "--json"]) == 0
    doc = json.loads(out.getvalue())
    assert (doc["params_mtp"], doc["params_total"]) == (45_376, 152_192)


def estimate_of(spec: Path):
    from msgen.estimate.memory import estimate
    from msgen.estimate.time import step_time

    plan = analysed(spec)
    est = estimate(plan)
    return plan, est, step_time(plan, est)


def test_the_modules_memory_and_flops_by_hand(tmp_path):
    """One device holds batch 1 (micro_batch 1 per dp rank) of seq 32; fp32.

    Logits row: each module's cross entropy keeps what the main one keeps (exp [32, 256]
    fp32 32,768 B, the label mask 8,192 B, the row sums 128 B): 41,088 B more per module.
    Other activations, per module: the shifted ids (int32, 128 B), enorm's input (the
    embedding, 32 x 64 x 4 = 8,192 B), eh_proj's input (the concatenation, 16,384 B),
    what a copy of the layer keeps (the estimate's activation_bytes_per_layer), the
    block's output (the module's norm input, 8,192 B) and the module's norm output (the
    output layer's input, 8,192 B); hnorm's input is the main norm's output, kept
    already. FLOPs (model, per step of 128 tokens): one more copy of the layer (what a
    third layer adds) and the matmuls of eh_proj [128 -> 64] and the output layer
    [64 -> 256], 2 x 3 x 128 x (128 x 64 + 64 x 256) = 18,874,368."""
    off = variant(tmp_path, "off", "mtp = none")
    three = variant(tmp_path, "three", "mtp = none", **{"layers   = 2": "layers   = 3"})
    _, base, base_t = estimate_of(off)
    _, with_mtp, mtp_t = estimate_of(SPEC)
    _, _, three_t = estimate_of(three)
    (b,), (m,) = base.stages, with_mtp.stages
    assert m.logits_bytes - b.logits_bytes == 32_768 + 8_192 + 128
    layer = b.activation_bytes_per_layer
    assert m.other_activations_bytes - b.other_activations_bytes == (
        128 + 8_192 + 16_384 + layer + 8_192 + 8_192
    )
    extra_layer = three_t.flops.model - base_t.flops.model
    assert mtp_t.flops.model - base_t.flops.model == extra_layer + 18_874_368
    # their weights, gradients and Adam states: 16 bytes per parameter (fp32, zero 0)
    assert m.weights_bytes - b.weights_bytes == 4 * 45_376
    assert m.optimizer_bytes - b.optimizer_bytes == 8 * 45_376


def test_the_module_runs_on_the_last_stage(tmp_path):
    """With pp = 2 the modules' parameters are on stage 1 with the output layer, in
    plan.json and in the estimate; model.py places the cell there."""
    spec = variant(
        tmp_path,
        "pp2",
        "mtp = mtp(depth = 1, weight = 0.3)",
        **{"    tp = 1\n": "    tp = 1\n    pp = 2\n", "per_node = 2": "per_node = 4"},
    )
    plan, est, _ = estimate_of(spec)
    stages = {path: e.stages for e in plan.network_entries() for path in [e.path]}
    mtp = [s for path, s in stages.items() if path.startswith("mtp.")]
    assert mtp and all(s == (1,) for s in mtp)
    assert stages["logits.weight"] == (1,)
    first, last = est.stages
    assert last.params - first.params >= plan.params_mtp
    folder = compile_spec(spec, tmp_path / "out")
    assert "self.mtp.pipeline_stage = 1" in (folder / "model.py").read_text()
    doc = __import__("json").loads((folder / "plan.json").read_text())
    placed = {p["path"]: p["stages"] for p in doc["params"] if p["path"].startswith("mtp.")}
    assert placed and all(s == [1] for s in placed.values())


@pytest.mark.parametrize(
    "line, code, where",
    [
        ("mtp = mtp(depth = 0)", "MSL530", "depth = 0"),
        ("mtp = mtp(depth = 32)", "MSL530", "depth = 32"),
        ("mtp = mtp(weight = -1)", "MSL530", "weight = -1"),
        ("mtp = mtp(layer = encoder)", "MSL530", "layer = encoder"),
        ("mtp = mtp(depths = 2)", "MSL530", "depths"),
        ("mtp = next(depth = 1)", "MSL530", "next"),
    ],
)
def test_bad_settings_are_located_diagnostics(tmp_path, capsys, line, code, where):
    from msgen.cli import main

    spec = variant(tmp_path, "bad", line)
    assert main(["check", str(spec)]) == 1
    err = capsys.readouterr().err
    assert f"error[{code}]" in err and where in err and "Traceback" not in err
    assert "hint:" in err


def test_a_network_the_modules_cannot_share_is_refused(tmp_path, capsys):
    """An output layer with a bias: the modules share the output layer's weight only."""
    from msgen.cli import main

    spec = variant(
        tmp_path,
        "bias",
        "mtp = mtp(depth = 1)",
        **{"logits = linear(norm, vocab, bias = false)": "logits = linear(norm, vocab)"},
    )
    assert main(["check", str(spec)]) == 1
    err = capsys.readouterr().err
    assert "error[MSL531]" in err and "Traceback" not in err


def test_a_layer_of_another_shape_is_refused(tmp_path, capsys):
    """`layer = NAME` must name a layer on the final norm's [batch, seq, hidden]: a
    module runs its copy between eh_proj and its norm. A repeated layer maps its shape
    to itself (MSL118), but it may work at another width."""
    from msgen.cli import main

    narrow = """layer narrow {
    input x : [batch, seq, 32] @ [dp, 1, 1]
    y    = linear(x, 32, bias = false)
    output x + y
}

network {"""
    spec = variant(
        tmp_path,
        "narrow",
        "mtp = mtp(layer = narrow)",
        **{
            "network {": narrow,
            "    norm   = rmsnorm(body)": "    down   = linear(body, 32, bias = false)\n"
            "    w      = repeat narrow(down) 1\n"
            "    back   = linear(w, hidden, bias = false)\n    norm   = rmsnorm(back)",
        },
    )
    assert main(["check", str(spec)]) == 1
    err = capsys.readouterr().err
    assert "error[MSL530]" in err and "layer `narrow`" in err and "Traceback" not in err
