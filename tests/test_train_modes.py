"""Training modes (msgen/emit/modes.py): the mode chosen once from the plan, each
concern's choices interchangeable, and one gradient-equivalence test per mode of the
step that one process runs.

A mode is (wiring, reducer, loss scale, micro-batch cell). The step of each mode that one
CPU process can run is built by the generated `build()` (stand-alone, or `--rehearse`'s
cells: GradReducer reading the gradients where RehearsedMirror leaves them, as the
parallel pass would) and takes one step in graph mode, as train.py runs it, on
test_rehearsal.py's tiny spec (dp 1 x tp 2) or, for the data-parallel tree,
tests/specs/tiny_dp.msl (dp 2); both clip at 1.0 and decay by 0.1, without dropout.

The oracle is the gradient of the step's mean loss taken directly: the bare network on the
whole step batch, differentiated by MindSpore with no loss scale, no micro-batches and no
reducer (`ms.value_and_grad`), in float64 from there on. The step must give
- the gradient norm it logs and clips with: the oracle's norm;
- the gradient the optimizer received, read back from AdamW's first moments, which after
  one step are exactly (1 - beta1) * g (and the second (1 - beta2) * g^2): the oracle
  gradient times the clip factor min(GRAD_CLIP / (norm + 1e-6), 1);
- the updated parameters: AdamW's published first step (Loshchilov and Hutter), written
  here in numpy, from those moments.
Tolerances: the step runs in fp32, summing micro-batches in another order than the
oracle's one batch; the loss scales are powers of two or 1/2 (exact in fp32), so the
step's gradients differ from the oracle's by fp32 rounding, about 1e-7 relative per
operation over a few hundred terms: rtol 1e-4 on gradients and norms, and an atol of
1e-5 of the largest gradient for entries near zero. AdamW's first step moves each weight
by about lr * sign(g), and by lr * g / (|g| + eps) where |g| is near eps = 1e-8, which the
fp32 rounding of such a g moves by up to a few thousandths of lr: so the update is
checked from the moments the step left (themselves checked against the oracle), to fp32
rounding (rtol 1e-5, atol lr * 1e-4).

The data-parallel mode's reducer (`replicas`: nn.DistributedGradReducer and the loss's
mean over the replicas) needs two processes: tests/test_multirank.py trains it under
msrun against the stand-alone run (slow); here its tree's step runs as --standalone does.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from fnmatch import fnmatch
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from msgen.emit.modes import CONCERNS, LOSS_SCALES, REDUCERS, WIRINGS, TrainMode
from tests.emit_fixtures import SPECS, compile_spec
from tests.test_rehearsal import write_spec

# both specs' AdamW and clip; the learning rate at step 0 is lr / warmup (the warmup's
# first step): 1e-2 / 1 in test_rehearsal.py's spec, 3e-3 / 2 in tiny_dp.msl
BETA1, BETA2, ADAM_EPS, WEIGHT_DECAY, GRAD_CLIP = 0.9, 0.95, 1e-8, 0.1, 1.0

# mode -> (zero, pp, micro_batches, loss_scale) of test_rehearsal.py's spec or a spec of
# tests/specs, the learning rate at step 0, and whether the step is the rehearsal's (the
# reducer a rank builds) or the stand-alone one
MODES = {
    # semi-auto, one micro-batch, one stage: no reducer; a fixed scale of 1024
    "none-static-GradAccumulation": ((0, 1, 1, "1024"), 1e-2, True),
    # semi-auto gradient accumulation, zero 1: gradients from the mirrors and accu_grads;
    # a fixed scale of 1 / micro_batches, so the factor is exactly 1 (GradReducer's note)
    "accumulated-static-GradAccumulation": ((1, 1, 2, "0.5"), 1e-2, True),
    # semi-auto pipeline of 2 stages, zero 1, dynamic loss scale
    "accumulated-dynamic-Pipeline": ((1, 2, 2, "dynamic"), 1e-2, True),
    # what --standalone runs of any tree: the logical model, no reducer, 2 micro-batches
    "standalone-none-GradAccumulation": ((0, 1, 2, "none"), 1e-2, False),
    # data parallel (dp 2, 2 micro-batches, dynamic scale) as --standalone runs it: the
    # replicas' step without its reducer, which needs two processes
    "replicas-dynamic-GradAccumulation": ("tiny_dp", 1.5e-3, False),
}
FAST = {"accumulated-dynamic-Pipeline"}


def spec(semi_auto: bool, pp: int, micro_batches: int):
    """What TrainMode.of reads of a checked spec (msgen.ir.models.Spec)."""
    return SimpleNamespace(
        semi_auto=semi_auto, mesh=SimpleNamespace(pp=pp), micro_batches=micro_batches
    )


def test_the_mode_is_chosen_once_from_the_mesh():
    def of(semi_auto, pp, micro_batches, loss_scale):
        return TrainMode.of(spec(semi_auto, pp, micro_batches), loss_scale)

    # data parallel: the micro-batches' sum is one graph, averaged over the replicas
    assert of(False, 1, 2, "dynamic") == TrainMode(
        "data_parallel", "replicas", "dynamic", "GradAccumulation"
    )
    assert of(True, 1, 1, "none") == TrainMode("semi_auto", "none", "none", "GradAccumulation")
    assert of(True, 1, 2, "static").reducer == "accumulated"
    assert of(True, 2, 2, "none") == TrainMode("semi_auto", "accumulated", "none", "Pipeline")
    assert of(True, 2, 2, "none").template("reducer") == "train/reducer/accumulated.py.j2"
    with pytest.raises(ValueError, match="does not go with"):
        TrainMode("data_parallel", "accumulated", "none", "GradAccumulation")
    with pytest.raises(ValueError, match="loss_scale 'fixed' is none of"):
        TrainMode("semi_auto", "none", "fixed", "GradAccumulation")
    with pytest.raises(ValueError, match="no concern"):
        of(True, 1, 1, "none").template("schedule")


# what a choice's template shares with another, not a hook
HELPERS = {"factor_init", "static"}


def test_each_concerns_choices_define_the_same_hooks():
    """train.py.j2 calls a concern's hooks whatever the choice: a hook one choice lacks
    would fail only the trees of that choice."""
    from msgen.resources import template

    for concern, choices in zip(CONCERNS, (WIRINGS, REDUCERS, LOSS_SCALES), strict=True):
        hooks = {
            choice: {
                name
                for name in dir(template(f"train/{concern}/{choice}.py.j2").module)
                if not name.startswith("_")
            }
            for choice in choices
        }
        every = set.union(*hooks.values()) - HELPERS
        assert len(every) > 5
        for choice, names in hooks.items():
            assert not every - names, f"{concern} {choice} lacks {sorted(every - names)}"


@contextlib.contextmanager
def imported(folder: Path):
    """folder/train.py imported as `train`, its model.py as `model`, for the test's span:
    graph mode parses a cell's code through its module (sys.modules), as train.py runs."""
    names = ("model", "train")
    saved = {name: sys.modules.pop(name) for name in names if name in sys.modules}
    sys.path.insert(0, str(folder))
    try:
        yield importlib.import_module("train")
    finally:
        sys.path.remove(str(folder))
        for name in names:
            sys.modules.pop(name, None)
        sys.modules.update(saved)


def adamw_first_step(p, m: np.ndarray, v: np.ndarray, lr: float, decay: bool) -> np.ndarray:
    """AdamW's step at t = 1 (torch.optim.AdamW's rule) to the moments `m`, `v` it left."""
    m_hat, v_hat = m / (1 - BETA1), v / (1 - BETA2)
    wd = WEIGHT_DECAY if decay else 0.0
    return p * (1 - lr * wd) - lr * m_hat / (np.sqrt(v_hat) + ADAM_EPS)


@pytest.mark.parametrize(
    "mode", [pytest.param(m, marks=() if m in FAST else pytest.mark.slow) for m in MODES]
)
def test_a_modes_step_takes_the_gradient_of_the_mean_loss(mode, tmp_path):
    import mindspore as ms

    case, lr, rehearse = MODES[mode]
    spec = SPECS[case] if isinstance(case, str) else write_spec(tmp_path, *case)
    folder = compile_spec(spec, tmp_path / "out")
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)  # the oracle's; the step switches to graph mode
    try:
        with imported(folder) as train:
            check_one_step(mode, train, lr, rehearse)
    finally:
        ms.set_context(mode=previous)


def check_one_step(mode, train, want_lr, rehearse):
    import mindspore as ms

    assert (train.BETAS, train.ADAM_EPS, train.WEIGHT_DECAY) == ((BETA1, BETA2), ADAM_EPS, 0.1)
    assert train.GRAD_CLIP == GRAD_CLIP
    ms.set_seed(train.SEED)
    built = train.build(False, rehearse)
    reducer, scale, cell = mode.split("-")
    # the cells the mode chose
    assert type(built.step_cell.network).__name__ == cell
    want_reducer = {"accumulated": "GradReducer"}.get(reducer) if rehearse else None
    found = getattr(built.step_cell, "reducer", None)
    assert (type(found).__name__ if found is not None else None) == want_reducer
    assert hasattr(built.step_cell, "scaler") == (scale == "dynamic")

    tokens, labels = next(train.synthetic_batches(1, 0, 0))
    weights = built.optimizer.parameters
    before = {p.name: p.asnumpy().astype(np.float64) for p in weights}
    value_and_grad = ms.value_and_grad(built.network, grad_position=None, weights=weights)
    mean_loss, grads = value_and_grad(ms.Tensor(tokens), ms.Tensor(labels))
    oracle = {p.name: g.asnumpy().astype(np.float64) for p, g in zip(weights, grads)}
    norm = float(np.sqrt(sum((g**2).sum() for g in oracle.values())))
    clip = min(GRAD_CLIP / (norm + 1e-6), 1.0)
    biggest = max(float(np.abs(g).max()) for g in oracle.values())

    ms.set_context(mode=ms.GRAPH_MODE)  # the step as train.py runs it: one graph
    loss, step_norm, lr, skipped = built.step_cell(ms.Tensor(tokens), ms.Tensor(labels))
    assert int(skipped.asnumpy()) == 0
    assert lr.asnumpy().item() == pytest.approx(want_lr)
    assert float(loss.asnumpy()) / train.MICRO_BATCHES == pytest.approx(
        float(mean_loss.asnumpy()), rel=1e-5
    )
    assert step_norm.asnumpy().item() == pytest.approx(norm, rel=1e-4)

    state = {p.name: p.asnumpy().astype(np.float64) for p in built.optimizer.get_parameters()}
    no_decay = train.NO_WEIGHT_DECAY  # which weights decay is not this test's question
    for name, g in oracle.items():
        received = g * clip
        np.testing.assert_allclose(
            state[f"adam_m.{name}"] / (1 - BETA1),
            received,
            rtol=1e-4,
            atol=1e-5 * biggest,
            err_msg=f"{mode}: the gradient the optimizer received for {name}",
        )
        np.testing.assert_allclose(
            state[f"adam_v.{name}"] / (1 - BETA2),
            received**2,
            rtol=1e-3,
            atol=(1e-5 * biggest) ** 2,
            err_msg=f"{mode}: its square for {name}",
        )
        decay = not any(fnmatch(name, pattern) for pattern in no_decay)
        m, v = state[f"adam_m.{name}"], state[f"adam_v.{name}"]
        np.testing.assert_allclose(
            state[name],
            adamw_first_step(before[name], m, v, want_lr, decay),
            rtol=1e-5,
            atol=want_lr * 1e-4,
            err_msg=f"{mode}: the updated {name}",
        )
