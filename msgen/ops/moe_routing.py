"""The moe op's routing (msgen/ops/moe.py): the scores, which experts each token goes
to, the weights it comes back with, and the losses and buffers that steer them.

- Scores: softmax over the experts, or a sigmoid per expert (DeepSeek-V3).
- Selection: the top_k of the scores, plus the aux-loss-free correction bias when
  `expert_bias` (DeepSeek-V3 §2.1.2, Wang et al. 2024 "Auxiliary-Loss-Free Load
  Balancing"; Megatron-LM `moe_router_enable_expert_bias`), limited to the
  `top_groups` best of `expert_groups` equal groups of experts (DeepSeek-V3's
  `n_group` / `topk_group`: a group scores the sum of its two best biased scores;
  DeepSeek-V2's `group_limited_greedy`: its best score, `group_score = max`).
- Weights: the chosen experts' unbiased scores (the bias never reaches them),
  renormalised when `norm_topk`, times `routed_scaling` (`routed_scaling_factor`).
- Losses: the batch-wise load-balancing loss (`aux_loss`), DeepSeek-V3's
  sequence-wise one (`seq_aux_loss`, eq. 17-20) and the z-loss.
- Buffers: with `expert_bias`, the bias and the step's routed copies per expert, fp32
  [experts], not trained: train.py moves the bias by `bias_rate` * sign(mean load -
  load) after each step (Megatron-LM moe_utils.py `get_updated_expert_bias`).

One home for the arguments, their checks, the settings the generated cell takes and
the buffers' names; the cell's code is templates/ops/moe_routing.py.j2."""

from __future__ import annotations

from msgen.ops.base import Arg, OpError

ARGS = (
    Arg("router", "name", "softmax", choices=("softmax", "sigmoid")),
    Arg("norm_topk", "bool", True),
    Arg("routed_scaling", "float", 1.0, within="(0, inf)"),
    Arg("expert_bias", "bool", False),
    Arg("bias_rate", "float", 1e-3, within="[0, inf)"),
    Arg("expert_groups", "int", 1),
    Arg("top_groups", "int", None),
    Arg("group_score", "name", "top2", choices=("top2", "max")),
    Arg("seq_aux_loss", "float", 0.0, within="[0, inf)"),
)

# The buffers of a biased router, [experts] fp32 each: not parameters (no gradient,
# no optimizer state, not in params_total), checkpointed and resharded as they are.
BUFFERS = ("expert_bias", "expert_load")


def value(node, name: str):
    arg = next(a for a in ARGS if a.name == name)
    return node.args.get(name, arg.default)


def groups(node) -> tuple[int, int]:
    """(expert_groups, top_groups): every group kept unless told."""
    g = value(node, "expert_groups")
    top = value(node, "top_groups")
    return g, g if top is None else top


def check(node) -> None:
    """The groups must split the experts evenly, keep at least one and at most all of
    them, and the kept groups hold top_k experts (DeepSeek-V3's 8 of 256 experts in 4
    of 8 groups); a group's top-2 sum needs two experts in it."""
    e, k = node.args["experts"], node.args["top_k"]
    g, top = groups(node)
    at = "expert_groups" if "expert_groups" in node.args else "top_groups"
    if g < 1 or e % g:
        raise OpError(
            "MSL119",
            f"expert_groups = {g} does not divide experts = {e}: the groups are equal",
            "expert_groups",
            f"use a number of groups that divides {e}",
        )
    if not 1 <= top <= g:
        raise OpError(
            "MSL119",
            f"top_groups = {top} must be between 1 and expert_groups = {g}",
            "top_groups",
            f"keep at most the {g} groups there are",
        )
    if top * (e // g) < k:
        raise OpError(
            "MSL119",
            f"top_groups = {top} groups of {e // g} experts hold fewer than top_k = {k}",
            at,
            f"keep at least {-(-k // (e // g))} groups",
        )
    if g > 1 and value(node, "group_score") == "top2" and e // g < 2:
        raise OpError(
            "MSL119",
            f"a group of {e // g} expert cannot score the sum of its top 2",
            "group_score",
            "use `group_score = max`, or fewer groups",
        )
    if "bias_rate" in node.args and not value(node, "expert_bias"):
        raise OpError(
            "MSL119",
            "bias_rate moves the correction bias, and there is none",
            "bias_rate",
            "add `expert_bias = true`, or drop bias_rate",
        )


def buffers(node) -> dict[str, tuple[int, ...]]:
    """The op's buffers by name, with their shapes: none without `expert_bias`."""
    if not value(node, "expert_bias"):
        return {}
    return {name: (node.args["experts"],) for name in BUFFERS}


def selection_bytes(node, n: int) -> int:
    """Memory-bound bytes of choosing beyond the plain top-k: the biased scores
    written and read, the groups' scores and the masked scores over [n, experts] in
    fp32, and the chosen weights gathered."""
    e = node.args["experts"]
    passes = 2 * bool(value(node, "expert_bias")) + 4 * (groups(node)[1] < groups(node)[0])
    return passes * n * e * 4
