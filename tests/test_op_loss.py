"""cross_entropy (msgen/ops/loss.py): its numpy reference; the generated cross entropy
is vocab-parallel (no gather of the logits) and equals the plain loss: the CrossEntropy
cell of each tiny spec's model.py, run stand-alone in MindSpore (CPU) with the
strategies the spec gives it, against numpy, value and gradient.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.emit_fixtures import TINY, compiled, load, network_class, plan, plan_json


def cross_entropy(logits, labels):
    z = logits - logits.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]
    return -picked.mean()


REFERENCES = {"cross_entropy": lambda op: cross_entropy(op.inputs[0], op.labels)}


def loss_cell(name: str):
    """The network's CrossEntropy cell, as the network instantiates it."""
    from mindspore.nn.utils import no_init_parameters

    with no_init_parameters():
        network = network_class(load(compiled(name), "model"), plan_json(name))()
    (cell,) = [c for _, c in network.cells_and_names() if type(c).__name__ == "CrossEntropy"]
    return cell


def numpy_gradient(logits, labels):
    """d mean(-log softmax(logits)[label]) / d logits."""
    z = np.exp(logits - logits.max(-1, keepdims=True))
    probs = z / z.sum(-1, keepdims=True)
    onehot = np.eye(logits.shape[-1])[labels]
    return (probs - onehot) / labels.size


@pytest.mark.parametrize("name", TINY)
def test_loss_and_gradient_equal_numpy(name):
    import mindspore as ms

    ms.set_context(mode=ms.PYNATIVE_MODE)
    cell = loss_cell(name)
    dims = plan(name).spec.model.dims
    seq, vocab = dims["seq"], dims["vocab"]
    rng = np.random.default_rng(1)
    logits = rng.normal(0.0, 4.0, (2, seq, vocab)).astype(np.float32)
    labels = rng.integers(0, vocab, (2, seq), np.int32)
    loss, grad = ms.value_and_grad(cell, grad_position=0)(ms.Tensor(logits), ms.Tensor(labels))
    expected = cross_entropy(logits.astype(np.float64), labels)
    assert abs(float(loss.asnumpy()) - expected) <= 1e-6 * max(1.0, abs(expected))
    want = numpy_gradient(logits.astype(np.float64), labels)
    assert np.abs(grad.asnumpy() - want).max() <= 1e-6 * np.abs(want).max()


def test_the_vocab_split_is_kept():
    """tiny_llama splits the vocab over tp: every primitive of its loss keeps that split
    (no AllGather of the logits), and the row reductions run over the split dim."""
    cell = loss_cell("tiny_llama")
    x = ((2, 2),)  # [batch * seq, vocab] over (dp, tp)
    assert cell.max.in_strategy == x and cell.sum.in_strategy == x
    assert cell.pick.in_strategy == x and cell.exp.in_strategy == x
    assert cell.one_hot.in_strategy == ((2, 2), (), ())
    assert cell.select.in_strategy == ((2, 2),) * 3
