"""tests/specs/tiny_mtp.msl (one multi-token prediction module, weight 0.3) and
tests/specs/tiny_mtp_moe.msl (DeepSeek-style: a dense first layer, moe after it, the
module's block a moe layer) trained by their generated train.py on the CPU: stand-alone
for STEPS steps, and under msrun as two data-parallel processes on the same global
batches (as tests/test_multirank.py trains the dense tiny_dp). The loss and the
modules' logged loss fall; the ranks log the stand-alone run's losses."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.emit_fixtures import SPECS, compile_spec, compiled, copy_compiled
from tests.test_multirank import finish, log_rows, msrun, standalone
from tests.test_rehearsal import assert_rehearsal_is_standalone, rehearse_and_standalone

STEPS = 20
WEIGHT = 0.3  # tiny_mtp's mtp weight

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["tiny_mtp", "tiny_mtp_moe"])
def runs(request, tmp_path_factory):
    name = request.param
    folder = copy_compiled(name, tmp_path_factory.mktemp("mtp") / name)
    steps = ("--synthetic", "--steps", str(STEPS))
    jobs = [
        (standalone(folder, "alone", *steps), folder),
        (msrun(folder, folder, folder / "ranks", *steps), folder),
    ]
    for proc, cwd in jobs:
        finish(proc, cwd)
    return folder


def test_it_trains_stand_alone_with_falling_losses(runs):
    """Step 1: both losses near uniform over 256 tokens, the loss about (1 + 0.3) of it
    (the main loss plus the weighted modules' loss); then both fall."""
    log = log_rows(runs / "alone" / "rank_0" / "log.csv")
    assert [int(r["step"]) for r in log] == list(range(1, STEPS + 1))
    loss = [float(r["loss"]) for r in log]
    mtp = [float(r["mtp_loss"]) for r in log]
    uniform = math.log(256)
    assert abs(mtp[0] - uniform) < 0.1 and abs(loss[0] - (1 + WEIGHT) * uniform) < 0.15
    assert np.mean(loss[-3:]) < 0.85 * loss[0], loss
    assert np.mean(mtp[-3:]) < 0.9 * mtp[0], mtp
    assert "mtp.layers.0.eh_proj.weight" in (runs / "plan.json").read_text()


def test_two_ranks_log_the_stand_alone_losses(runs):
    alone = log_rows(runs / "alone" / "rank_0" / "log.csv")
    for rank in (0, 1):
        log = log_rows(runs / "ranks" / f"rank_{rank}" / "log.csv")
        assert [int(r["step"]) for r in log] == list(range(1, STEPS + 1))
        for mine, theirs in zip(log, alone, strict=True):
            for key in ("loss", "mtp_loss", "grad_norm"):
                assert float(mine[key]) == pytest.approx(float(theirs[key]), abs=1e-4), key


def test_the_compiled_tree_is_the_fixture(runs):
    """The run's tree is the shared compile of its spec, untouched."""
    assert (runs / "model.py").read_text() == (compiled(runs.name) / "model.py").read_text()


# tiny_mtp on dp 2 x tp 2 x pp 2 with zero 1, the output layer split over tp, a
# checkpoint every step (the rehearsal's comparison reads them)
PIPELINED = {
    "    per_node = 2": "    per_node = 8",
    "    tp = 1\n": "    tp = 2\n    pp = 2\n",
    "    micro_batches = 2": "    micro_batches = 4",
    "    global_batch = 4             # = micro_batch * dp * micro_batches = 1 * 2 * 2": (
        "    global_batch = 8\n    zero         = 1\n    checkpoint   = every 1 keep 3"
    ),
    "logits = linear(norm, vocab, bias = false)": (
        "logits = linear(norm, vocab, bias = false) weight @ [1, tp]"
    ),
}


def test_a_pipelined_rehearsal_with_the_module_on_the_last_stage_trains_as_standalone(
    tmp_path,
):
    """`train.py --rehearse` builds what the 8-rank run builds (the pipeline of 4
    micro-batches, the module's cell on stage 1) and trains as `--standalone` does."""
    text = SPECS["tiny_mtp"].read_text()
    for old, new in PIPELINED.items():
        assert old in text, old
        text = text.replace(old, new)
    spec = tmp_path / "tiny_mtp.msl"
    spec.write_text(text)
    folder = compile_spec(spec, tmp_path / "out")
    assert "self.mtp.pipeline_stage = 1" in (folder / "model.py").read_text()
    rehearse_and_standalone(folder)
    assert_rehearsal_is_standalone(folder)
    logs = [
        log_rows(folder / f"output_{m}" / "rank_0" / "log.csv") for m in ("rehearse", "standalone")
    ]
    for ours, theirs in zip(*logs, strict=True):
        assert float(ours["mtp_loss"]) == pytest.approx(float(theirs["mtp_loss"]), rel=1e-5)
