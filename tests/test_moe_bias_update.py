"""moe's correction bias (`expert_bias`) as a buffer: the generated cell counts each
expert's routed copies while training (not while evaluating), model.py's
update_expert_bias moves the bias by the sign rule (DeepSeek-V3 §2.1.2; Megatron-LM
moe_utils.py `get_updated_expert_bias`) against the numpy reference
(tests/reference_routing.py `update_bias`) over 3 steps of fixed counts, and train.py
does it after every step: the checkpoints carry the bias and no optimizer state for
it, and it is no parameter of the estimate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from msgen.analysis.plan import Plan
from msgen.compiler import analyze_text
from tests.emit_fixtures import compile_spec, load, network_class
from tests.reference_routing import choose, scores, update_bias
from tests.test_multirank import checkpoint, finish, standalone

SPEC = Path(__file__).resolve().parent / "specs" / "tiny_moe.msl"
RATE = 0.01
BIASED = f"router = sigmoid, expert_bias = true, bias_rate = {RATE}, "


def text(routing: str = BIASED) -> str:
    return SPEC.read_text().replace("aux_loss = 0.01", routing + "aux_loss = 0.01")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("biased")
    (folder / "tiny_moe.msl").write_text(
        text().replace(
            "    seed         = 1234", "    checkpoint   = every 1 keep 5\n    seed = 1234"
        )
    )
    return compile_spec(folder / "tiny_moe.msl", folder / "out")


def network(compiled: Path):
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE)
    model = load(compiled, "model")
    net = network_class(model, json.loads((compiled / "plan.json").read_text()))()
    return model, net


def test_the_update_follows_the_sign_rule_over_three_steps(compiled):
    """Fixed counts of routed copies per expert over 3 steps, for both layers: each
    bias moves by RATE toward balance (an expert at the mean stays), as the numpy
    reference does, and the count starts again from zero."""
    import mindspore as ms

    model, net = network(compiled)
    cells = [layer.ffn2 for layer in net.decoder]
    counts = [
        [np.array([5.0, 3.0, 0.0, 8.0]), np.array([4.0, 4.0, 4.0, 4.0])],
        [np.array([4.0, 4.0, 1.0, 7.0]), np.array([0.0, 10.0, 3.0, 3.0])],
        [np.array([2.0, 2.0, 2.0, 10.0]), np.array([6.0, 1.0, 1.0, 8.0])],
    ]
    want = [np.zeros(4), np.zeros(4)]
    for step in counts:
        for cell, count in zip(cells, step, strict=True):
            cell.expert_load.set_data(ms.Tensor(count.astype(np.float32)))
        model.update_expert_bias(net)
        want = [update_bias(b, count, RATE) for b, count in zip(want, step, strict=True)]
        for cell, bias in zip(cells, want, strict=True):
            np.testing.assert_allclose(cell.expert_bias.asnumpy(), bias, atol=1e-7)
            assert not cell.expert_load.asnumpy().any()
    # after 3 steps the first layer's expert 2, under the mean each time, is 3 rates up
    assert abs(want[0][2] - 3 * RATE) < 1e-12 and want[1][0] == 0.0


def test_training_counts_the_routed_copies_and_evaluating_does_not(compiled):
    """The cell's count after a training forward is the numpy reference's copies per
    expert, chosen by the biased scores; an evaluation forward adds nothing."""
    import mindspore as ms

    _, net = network(compiled)
    cell = net.decoder[0].ffn2
    rng = np.random.default_rng(3)
    bias = rng.normal(0.0, 0.1, 4)
    cell.expert_bias.set_data(ms.Tensor(bias.astype(np.float32)))
    x = rng.normal(size=(2, 8, 64)).astype(np.float32)
    cell.set_train(True)
    cell(ms.Tensor(x))
    router = cell.router.asnumpy().astype(np.float64)
    chosen = choose(scores(x.reshape(-1, 64) @ router, "sigmoid"), 2, bias)
    want = np.bincount(chosen.ravel(), minlength=4)
    np.testing.assert_array_equal(cell.expert_load.asnumpy(), want)
    cell.set_train(False)
    cell(ms.Tensor(x))
    np.testing.assert_array_equal(cell.expert_load.asnumpy(), want)


def test_the_buffers_are_not_parameters_of_the_estimate():
    """params_total is the same with and without the bias; plan.json lists the buffers
    apart, whole, on their layer's stage."""
    plain = analyze_text(text(""), "spec.msl", SPEC.parent)
    biased = analyze_text(text(), "spec.msl", SPEC.parent)
    assert (
        Plan(plain.spec, plain.facts).params_total == Plan(biased.spec, biased.facts).params_total
    )
    buffers = Plan(biased.spec, biased.facts).buffers()
    assert buffers == {
        f"decoder.{i}.ffn2.{name}": (4,)
        for i in range(2)
        for name in ("expert_bias", "expert_load")
    }


@pytest.mark.slow
def test_train_py_moves_the_bias_after_every_step(compiled, tmp_path):
    """Three steps of train.py --standalone --synthetic: each step's checkpoint holds
    a bias that moved from the previous one's by -RATE, 0 or +RATE per expert, not all
    by 0 (the step's counts reached it), a zero count, and no optimizer moments for
    either buffer."""
    import shutil

    folder = tmp_path / "tree"
    shutil.copytree(compiled, folder)
    finish(standalone(folder, "output", "--synthetic", "--steps", "3"), folder)
    rank = folder / "output" / "rank_0"
    saved = [checkpoint(rank / f"step_{s:08d}.ckpt") for s in (1, 2, 3)]
    before = {i: np.zeros(4) for i in range(2)}
    for state in saved:
        assert not [n for n in state if n.startswith(("adam_m.", "adam_v.")) and "expert" in n]
        for i in range(2):
            bias = state[f"decoder.{i}.ffn2.expert_bias"]
            steps = np.round((bias - before[i]) / RATE)
            assert set(steps.tolist()) <= {-1.0, 0.0, 1.0}
            np.testing.assert_allclose(bias - before[i], steps * RATE, atol=1e-6)
            assert steps.any() and not state[f"decoder.{i}.ffn2.expert_load"].any()
            before[i] = bias


def test_msgen_ckpt_merge_gives_back_each_stages_buffers(tmp_path):
    """tiny_moe biased on dp 2, tp 2, pp 2: each layer's moe (one per stage) keeps its
    buffers whole in its stage's strategy file, without moments; a run laid out as
    train.py saves it (tests/test_strategy_merge.py `cut` for the parameters' slices)
    merges with `msgen ckpt merge` into every buffer as it was, the second stage's
    included."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    import mindspore as ms

    from msgen.cli import main
    from tests.emit_fixtures import every_param
    from tests.test_strategy_merge import cut, full_state, place

    spec = tmp_path / "tiny_moe.msl"
    piped = text().replace("    dp = 4\n    tp = 2\n}", "    dp = 2\n    tp = 2\n    pp = 2\n}")
    spec.write_text(piped.replace("global_batch = 8 ", "global_batch = 4 "))
    tree = compile_spec(spec, tmp_path / "tree")
    doc = json.loads((tree / "plan.json").read_text())
    params = {p["path"]: p for p in every_param(doc)}
    rng = np.random.default_rng(1)
    full = full_state(tree)
    buffers = {f"decoder.{i}.ffn2.{n}": rng.normal(size=4).astype(np.float32)
               for i in range(2) for n in ("expert_bias", "expert_load")}  # fmt: skip
    for rank in range(doc["devices"]):
        stage = place(doc, "pp", rank)
        folder = tmp_path / "run" / f"rank_{rank}"
        folder.mkdir(parents=True)
        strategy = tree / "strategy" / f"stage_{stage}.json"
        layouts = json.loads(strategy.read_text())["parallel_layout_item"]
        assert sorted(n for n in layouts if "expert_" in n) == [
            f"decoder.{stage}.ffn2.expert_bias",
            f"decoder.{stage}.ffn2.expert_load",
        ]
        (folder / "strategy.json").write_text(strategy.read_text())
        state = [{"name": "global_step", "data": ms.Tensor(full["global_step"])}]
        for name, value in full.items():
            path = name.removeprefix("adam_m.").removeprefix("adam_v.")
            if path in params and stage in params[path]["stages"]:
                sliced = cut(value, params[path], layouts[path], rank, doc)
                state.append({"name": name, "data": ms.Tensor(sliced)})
        state += [{"name": n, "data": ms.Tensor(v)} for n, v in buffers.items() if n in layouts]
        ms.save_checkpoint(state, str(folder / "step_00000001.ckpt"))
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        code = main(
            ["ckpt", "merge", str(spec), str(tmp_path / "run"), "-o", str(tmp_path / "m.ckpt")]
        )
    assert code == 0, err.getvalue()
    merged = checkpoint(tmp_path / "m.ckpt")
    for name, value in buffers.items():
        np.testing.assert_array_equal(merged[name], value, err_msg=name)
        assert "adam_m." + name not in merged


@pytest.mark.slow
def test_two_data_parallel_ranks_move_one_bias(tmp_path):
    """tests/specs/tiny_moe_dp.msl biased, 3 steps as two data-parallel processes under
    msrun: each rank routes its own rows, and train.py sums the ranks' counts before
    the update, so both ranks hold the same bias after every step (their own counts
    differ: without the sum they would part), moved by -RATE, 0 or +RATE per expert."""
    from tests.emit_fixtures import SPECS
    from tests.test_multirank import msrun

    text = (
        SPECS["tiny_moe_dp"]
        .read_text()
        .replace("shared_ffn = ffn)", f"shared_ffn = ffn, {BIASED[:-2]})")
    )
    text = text.replace(
        "    seed         = 1234", "    seed         = 1234\n    checkpoint = every 1 keep 3"
    )
    (tmp_path / "biased.msl").write_text(text)
    tree = compile_spec(tmp_path / "biased.msl", tmp_path / "out")
    assert "update_expert_bias(network, ReplicaMean() if distributed else None)" in (
        (tree / "train.py").read_text()
    )
    finish(msrun(tree, tree, tree / "msrun", "--synthetic", "--steps", "3"), tree)
    before = np.zeros(4)
    for step in (1, 2, 3):
        ranks = [checkpoint(tree / "msrun" / f"rank_{r}" / f"step_{step:08d}.ckpt") for r in (0, 1)]
        for layer in range(2):
            name = f"decoder.{layer}.ffn2.expert_bias"
            np.testing.assert_array_equal(ranks[0][name], ranks[1][name], err_msg=name)
        bias = ranks[0]["decoder.0.ffn2.expert_bias"]
        moved = np.round((bias - before) / RATE)
        assert set(moved.tolist()) <= {-1.0, 0.0, 1.0} and moved.any()
        before = bias
