"""The moe op's routing in numpy, token by token from the published definitions (not
from msgen's code): DeepSeek-V3 (arXiv 2412.19437) §2.1.2 eq. 12-16 and its
inference/model.py `Gate` for the scores, the correction bias, the groups and the
weights, eq. 17-20 for the sequence-wise loss; DeepSeek-V2 (arXiv 2405.04434) §2.1.2
for `group_limited_greedy`; Megatron-LM moe_utils.py for the batch-wise loss and
`get_updated_expert_bias` for the bias update."""

from __future__ import annotations

import numpy as np


def scores(logits, score: str):
    if score == "softmax":
        z = np.exp(logits - logits.max(-1, keepdims=True))
        return z / z.sum(-1, keepdims=True)
    return 1.0 / (1.0 + np.exp(-logits))


def choose(s, top_k, bias=None, groups=1, top_groups=None, group_score="top2"):
    """Each token's top_k experts [n, k], by s + bias, among its top_groups best of
    `groups` equal groups (scored by the sum of their two best biased scores, or
    their best); the experts of the other groups cannot be chosen."""
    choice = s if bias is None else s + bias
    n, e = choice.shape
    if top_groups is not None and top_groups < groups:
        grouped = choice.reshape(n, groups, e // groups)
        if group_score == "top2":
            best = np.sort(grouped, -1)[..., -2:].sum(-1)
        else:
            best = grouped.max(-1)
        kept = np.argsort(-best, -1, kind="stable")[:, :top_groups]
        mask = np.zeros((n, groups), bool)
        np.put_along_axis(mask, kept, True, -1)
        choice = np.where(np.repeat(mask, e // groups, axis=1), choice, -np.inf)
    return np.argsort(-choice, -1, kind="stable")[:, :top_k]


def route(tokens, router, top_k, score="softmax", norm_topk=True, bias=None, expert_groups=1,
          top_groups=None, group_score="top2", scaling=1.0):  # fmt: skip
    """(full scores [n, E], chosen experts [n, k], their weights [n, k]): the weights
    the chosen experts' unbiased scores, normalised by their sum when `norm_topk`
    (sigmoid scores plus 1e-20, as Megatron and transformers), times `scaling`."""
    s = scores(tokens @ router, score)
    chosen = choose(s, top_k, bias, expert_groups, top_groups, group_score)
    weights = np.take_along_axis(s, chosen, -1)
    if norm_topk:
        weights = weights / (weights.sum(-1, keepdims=True) + (1e-20 if score == "sigmoid" else 0))
    return s, chosen, weights * scaling


def for_losses(s, score: str):
    """The probabilities the balancing losses read: sigmoid scores normalised per token
    (DeepSeek-V3 eq. 19's s'; Megatron's router)."""
    return s / (s.sum(-1, keepdims=True) + 1e-20) if score == "sigmoid" else s


def load_balancing_loss(probs, chosen, experts, coeff):
    """Switch's loss as Megatron's switch_load_balancing_loss_func computes it:
    coeff * E / (n^2 k) * sum_e (sum_t p_te) * tokens_e."""
    n, k = chosen.shape
    counts = np.bincount(chosen.ravel(), minlength=experts)
    return coeff * experts / (n * n * k) * float(probs.sum(0) @ counts)


def sequence_loss(probs, chosen, experts, seq, coeff):
    """DeepSeek-V3 eq. 17-20, averaged over the sequences (consecutive `seq` tokens):
    coeff * sum_e f_e P_e, f_e = E / (k T) * (tokens of the sequence choosing e),
    P_e = the mean over the sequence of e's normalised score."""
    n, k = chosen.shape
    losses = []
    for start in range(0, n, seq):
        counts = np.bincount(chosen[start : start + seq].ravel(), minlength=experts)
        f = experts / (k * seq) * counts
        losses.append(float(f @ probs[start : start + seq].mean(0)))
    return coeff * float(np.mean(losses))


def update_bias(bias, load, rate):
    """bias + rate * sign(mean load - load) (DeepSeek-V3 §2.1.2: gamma raises the bias
    of an underloaded expert and lowers an overloaded one's)."""
    return bias + rate * np.sign(load.mean() - load)
