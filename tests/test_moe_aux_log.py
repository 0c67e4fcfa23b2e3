"""log.csv's `aux_loss`: the moe layers' auxiliary losses of a step as Megatron-LM logs
them, averaged over the step's micro-batches (megatron/core/transformer/moe/
moe_utils.py: save_to_aux_losses_tracker adds each micro-batch's loss per layer,
track_moe_metrics scales the sums by 1 / micro-batches, the training loop's
moe_loss_scale), and logged with pp > 1 too, where the last stage holds the sum over
every stage's layers.

The oracle is the numpy reference (tests/reference_numpy.py, the moe op's from
tests/test_op_moe.py) run on each micro-batch's tokens with the weights the step
started from (the previous step's checkpoint), its ops' auxiliary losses summed and
the micro-batches' sums averaged. tiny_moe with pp = 2 and 2 micro-batches, stand-alone
and `--rehearse`; steps 2 and 3 are compared, so a step that kept the last one's sum
would differ."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from tests import emit_fixtures
from tests import reference_numpy as ref
from tests.emit_fixtures import SPECS, compile_spec
from tests.test_rehearsal import STEPS, checkpoint, rehearse_and_standalone

LOGGED = 1e-5  # log.csv keeps 6 significant digits


def spec_with_pp2(folder: Path) -> Path:
    """tiny_moe (2 micro-batches, aux_loss 0.01) with pp = 2 over two servers and a
    checkpoint after every step."""
    text = SPECS["tiny_moe"].read_text()
    text = text.replace("    tp = 2\n}", "    tp = 2\n    pp = 2\n}")
    text = text.replace('nodes    = ["127.0.0.1"]', 'nodes    = ["127.0.0.1", "127.0.0.2"]')
    text = text.replace(
        "    seed         = 1234", f"    seed         = 1234\n    checkpoint = every 1 keep {STEPS}"
    )
    path = folder / "tiny_moe.msl"
    path.write_text(text)
    return path


def plan_of(path: Path):
    from msgen.analysis.plan import build_plan
    from msgen.compiler import analyze

    result = analyze(path)
    assert result.ok, [d.message for d in result.diagnostics]
    return build_plan(result.spec, result.facts)


def micro_batch_losses(plan, params: dict, tokens, labels, micro_batches: int) -> list[float]:
    """Each micro-batch's auxiliary losses (all moe layers'), by the numpy reference:
    the micro-batches are the batch's consecutive equal slices, as MindSpore's
    _MicroBatch cuts them (nn/wrap/cell_wrapper.py)."""
    from msgen.analysis.facts import context

    params = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
    rows = len(tokens) // micro_batches
    sums = []
    for m in range(micro_batches):
        part = slice(m * rows, (m + 1) * rows)
        aux: list[float] = []
        ref.run_graph(
            plan, "network", tokens[part], params, "", labels[part], context(plan.spec), aux
        )
        assert aux  # the moe layers'
        sums.append(sum(aux))
    return sums


def logged_aux(folder: Path, mode: str) -> list[float]:
    with (folder / f"output_{mode}" / "rank_0" / "log.csv").open() as f:
        return [float(row["aux_loss"]) for row in csv.DictReader(f)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("aux_log")
    path = spec_with_pp2(root)
    folder = compile_spec(path, root / "out")
    rehearse_and_standalone(folder)
    return folder, plan_of(path)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["standalone", "rehearse"])
def test_aux_loss_is_the_mean_over_the_micro_batches_with_pp2(runs, mode):
    """Steps 2 and 3 log the oracle's mean within log.csv's rounding; the two
    micro-batches' losses differ by far more, so the last one alone, their sum or a
    sum carried over from the step before would not pass."""
    folder, plan = runs
    train = emit_fixtures.load(folder, "train")
    assert train.PP == 2 and train.MICRO_BATCHES == 2
    logged = logged_aux(folder, mode)
    assert len(logged) == STEPS
    batches = train.synthetic_batches(1, 0, 0)
    next(batches)  # step 1's
    for step in range(2, STEPS + 1):
        tokens, labels = next(batches)
        params = checkpoint(folder, mode, step - 1)
        sums = micro_batch_losses(plan, params, tokens, labels, train.MICRO_BATCHES)
        expected = float(np.mean(sums))
        tolerance = LOGGED * expected
        assert abs(sums[0] - sums[1]) > 20 * tolerance, sums  # the test can tell them apart
        assert abs(logged[step - 1] - expected) <= tolerance, (step, logged, sums)
    # step 1, from the initial weights: two layers near 0.01 each for a router near uniform
    assert 0.9 * 0.02 < logged[0] < 2 * 0.02, logged


@pytest.mark.slow
def test_the_rehearsal_logs_the_standalone_aux_loss(runs):
    folder, _ = runs
    assert logged_aux(folder, "rehearse") == pytest.approx(
        logged_aux(folder, "standalone"), rel=LOGGED
    )


def test_the_record_sits_with_the_loss_on_an_interleaved_pipeline(tmp_path):
    """With virtual stages the cell that adds and records the auxiliary losses runs
    where the loss is computed: the output op's stage and chunk (pipeline_segment)."""
    text = spec_with_pp2(tmp_path).read_text().replace("layers   = 2", "layers   = 4")
    text = text.replace(
        "micro_batches = 2", "micro_batches = 2\n    schedule = interleaved(chunks = 2)"
    )
    (tmp_path / "tiny_moe.msl").write_text(text)
    model = (compile_spec(tmp_path / "tiny_moe.msl", tmp_path / "out") / "model.py").read_text()
    placed = {
        attr: [
            line.split(" = ")[1] for line in model.splitlines() if f"self.{attr}.pipeline_" in line
        ]
        for attr in ("output", "add_aux")
    }
    assert placed["add_aux"] == placed["output"] == ["1", "1"]
