"""The generated TrainStep's gradient arithmetic, one step on the CPU (PyNative): the
gradient norm it logs, and clips with, is the norm of the gradient of the step's mean
loss, with a dynamic and a fixed loss scale and 2 micro-batches.

The step's network (GradAccumulation) returns the sum of the micro-batches' mean
losses, and the backward pass runs on that sum times the loss scale; so the step must
divide its gradients by the loss scale and by the micro-batches to get the gradient of
the step's mean loss (equal micro-batches: the mean of their means is the mean over
all the step's tokens). The oracle is that gradient taken directly: the bare network's
loss on the whole batch, differentiated by MindSpore with no scale and no micro-batches,
its norm summed in numpy (float64); and, so that the oracle does not rest on MindSpore's
autodiff alone, its projection on a random direction is the central difference of the
numpy reference's loss (tests/reference_numpy.py, float64). AdamW's first update is
nearly sign(gradient), so a wrong factor hides from the loss curve; the logged norm
(log.csv's grad_norm, what `msgen report` judges) and the clip are where it shows.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests import reference_numpy as ref
from tests.emit_fixtures import compile_spec, load
from tests.test_rehearsal import write_spec

# tests/test_rehearsal.py's tiny spec (zero 0, pp 1, 2 micro-batches), run stand-alone
LOSS_SCALES = {"dynamic": "dynamic", "fixed": "1024"}


@pytest.mark.parametrize("kind", sorted(LOSS_SCALES))
def test_the_logged_norm_is_the_norm_of_the_mean_losss_gradient(kind, tmp_path):
    import mindspore as ms

    from msgen.analysis.plan import build_plan
    from msgen.compiler import analyze

    spec = write_spec(tmp_path, 0, 1, 2, LOSS_SCALES[kind])
    folder = compile_spec(spec, tmp_path / "out")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    train = load(folder, "train")
    assert train.MICRO_BATCHES == 2 and train.GRAD_CLIP == 1.0
    ms.set_seed(train.SEED)
    built = train.build(False, False)
    tokens, labels = next(train.synthetic_batches(1, 0, 0))
    assert tokens.shape[0] == train.STEP_ROWS == 2 * train.MICRO_BATCH

    weights = built.optimizer.parameters
    value_and_grad = ms.value_and_grad(built.network, grad_position=None, weights=weights)
    mean_loss, grads = value_and_grad(ms.Tensor(tokens), ms.Tensor(labels))
    grads = [g.asnumpy().astype(np.float64) for g in grads]
    want = float(np.sqrt(sum((g**2).sum() for g in grads)))
    assert want > 1.0  # above GRAD_CLIP: the step clips with this norm

    # The oracle's gradient along a random direction, against the numpy reference.
    params = {p.name: p.asnumpy().astype(np.float64) for p in built.network.get_parameters()}
    result = analyze(spec)
    plan = build_plan(result.spec, result.facts)
    rng = np.random.default_rng(0)
    direction = {p.name: rng.normal(size=p.shape) for p in weights}
    eps = 1e-5

    def loss_at(t: float) -> float:
        moved = {k: v + t * direction[k] if k in direction else v for k, v in params.items()}
        return ref.forward_loss(plan, moved, tokens, labels)

    numeric = (loss_at(eps) - loss_at(-eps)) / (2 * eps)
    analytic = sum(float((g * direction[p.name]).sum()) for g, p in zip(grads, weights))
    assert analytic == pytest.approx(numeric, rel=1e-4)

    loss, norm, _, skipped = built.step_cell(ms.Tensor(tokens), ms.Tensor(labels))
    assert int(skipped.asnumpy()) == 0
    # the step returns the micro-batches' sum; train.py logs it over MICRO_BATCHES
    assert float(loss.asnumpy()) / 2 == pytest.approx(float(mean_loss.asnumpy()), rel=1e-5)
    assert norm.asnumpy().item() == pytest.approx(want, rel=1e-5)
