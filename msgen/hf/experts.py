"""The experts of a Hugging Face mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE),
read from its config.json: how many, how many a token takes, their width, whether the
chosen weights are renormalised, which layers have them, Qwen2-MoE's shared expert, and
the load-balancing coefficient in msgen's terms. The keys and defaults are transformers
4.57's (`configuration_mixtral.py`, `configuration_qwen2_moe.py`,
`configuration_qwen3_moe.py`).

Routing is transformers' in both: a softmax over all experts in fp32, the top k, the
k weights divided by their sum where `norm_topk_prob` (Mixtral always), no capacity
(every expert takes every token routed to it): msgen's `moe` with `router = softmax`,
dropless, `norm_topk` as the config says.

The load-balancing loss. transformers (`load_balancing_loss_func`) takes the router
logits of all L sparse layers together: with T = L n routed tokens,
`E * sum_e f_e P_e`, f_e the share of the T k top-k slots that chose e and P_e the mean
probability of e, times `router_aux_loss_coef`. msgen's `aux_loss = c` is Megatron-LM's
per layer, `c * E * sum_e f_le P_le` with f_le the share of the layer's n k copies,
summed over the layers: per layer it is 1 / k of the function's value on that layer's
logits, so c = coef * k / L makes msgen's loss coef times the mean over the layers of
the function's per-layer value. That equals transformers' exactly for one sparse
layer, and for every routing that loads each layer's experts alike (uniform routing
gives coef * k in both); in general transformers' pools the layers' counts and
probabilities before multiplying them, which no per-layer loss reproduces.
"""

from __future__ import annotations

from dataclasses import dataclass

from msgen.base.readers import Bool, Int, List, Num
from msgen.base.status import UsageError
from msgen.lowering.evaluate import DIM_LIMIT

_DIM = Int(1, DIM_LIMIT - 1)
_COUNT = Int(0, DIM_LIMIT - 1)
_COMMON = {
    "num_experts_per_tok": _DIM,
    "router_aux_loss_coef": Num(),
    "output_router_logits": Bool(),
    "intermediate_size": _DIM,
}
_QWEN = {
    **_COMMON,
    "num_experts": _COUNT,
    "moe_intermediate_size": _DIM,
    "norm_topk_prob": Bool(),
    "decoder_sparse_step": _DIM,
    "mlp_only_layers": List(_COUNT, max_len=DIM_LIMIT),
}
MOE_KEYS = {
    "mixtral": {**_COMMON, "num_local_experts": _DIM, "router_jitter_noise": Num()},
    "qwen3_moe": _QWEN,
    "qwen2_moe": {**_QWEN, "shared_expert_intermediate_size": _DIM},
}
# transformers' defaults for a key config.json leaves out, per family
DEFAULTS = {
    "mixtral": {
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "intermediate_size": 14336,
        "router_aux_loss_coef": 0.001,
        "router_jitter_noise": 0.0,
    },
    "qwen3_moe": {
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 768,
        "intermediate_size": 6144,
        "norm_topk_prob": False,
        "router_aux_loss_coef": 0.001,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    },
    "qwen2_moe": {
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
        "intermediate_size": 5632,
        "norm_topk_prob": False,
        "router_aux_loss_coef": 0.001,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    },
}


class ExpertsError(UsageError):
    """A config whose experts msgen cannot mean (status 2, one line naming the key)."""


@dataclass(frozen=True)
class HfMoe:
    """The experts in msgen's terms."""

    experts: int
    top_k: int
    ffn: int  # each expert's width
    norm_topk: bool
    aux_coef: float  # router_aux_loss_coef, as transformers reads it
    sparse: tuple[bool, ...]  # per layer: experts (True) or the dense MLP
    shared_ffn: int = 0  # the shared experts' width
    shared_sigmoid: bool = True  # Qwen2-MoE's sigmoid gate on them (DeepSeek has none)
    routing: object = None  # DeepSeek's routing (msgen.hf.deepseek.Routing)

    @property
    def aux_loss(self) -> float:
        """msgen's `aux_loss` coefficient for router_aux_loss_coef (module docstring)."""
        return self.aux_coef * self.top_k / max(1, sum(self.sparse))


def moe_params(moe: HfMoe, hidden: int) -> int:
    """A sparse layer's feed-forward parameters: the router and the experts' three
    matrices each (modeling_mixtral.py MixtralSparseMoeBlock, modeling_qwen3_moe.py),
    and the shared experts' three, with Qwen2-MoE's gate [1, hidden]
    (modeling_qwen2_moe.py Qwen2MoeSparseMoeBlock)."""
    shared = (3 * moe.shared_ffn + moe.shared_sigmoid) * hidden if moe.shared_ffn else 0
    return hidden * moe.experts + moe.experts * 3 * hidden * moe.ffn + shared


def _get(config: dict, family: str, key: str):
    value = config.get(key)
    return DEFAULTS[family][key] if value is None else value


def _sparse(config: dict, family: str, layers: int, experts: int) -> tuple[bool, ...]:
    """Which layers have experts: all of Mixtral's; Qwen2-MoE's and Qwen3-MoE's as their
    decoder layer decides (modeling_qwen3_moe.py Qwen3MoeDecoderLayer, and
    Qwen2MoeDecoderLayer alike: not in mlp_only_layers, and
    (i + 1) % decoder_sparse_step == 0, and num_experts > 0)."""
    if family == "mixtral":
        return (True,) * layers
    dense = _get(config, family, "mlp_only_layers")
    beyond = [i for i in dense if i >= layers]
    if beyond:
        raise ExpertsError(f"mlp_only_layers names layer {beyond[0]} of {layers}")
    step = _get(config, family, "decoder_sparse_step")
    return tuple(experts > 0 and i not in dense and (i + 1) % step == 0 for i in range(layers))


def moe_of(config: dict, family: str, layers: int) -> HfMoe | None:
    """The experts of a checked config of an experts' family; None when no layer has
    any (a Qwen3-MoE with num_experts 0 is dense)."""
    key = "num_local_experts" if family == "mixtral" else "num_experts"
    experts = _get(config, family, key)
    top_k = _get(config, family, "num_experts_per_tok")
    if family == "mixtral" and _get(config, family, "router_jitter_noise") != 0:
        raise ExpertsError(
            "router_jitter_noise is not 0: Mixtral multiplies the router's input by "
            "random noise in training, which msgen's moe does not"
        )
    sparse = _sparse(config, family, layers, experts)
    if not any(sparse):
        return None
    if top_k > experts:
        raise ExpertsError(f"num_experts_per_tok = {top_k} is more than {key} = {experts}")
    coef = _get(config, family, "router_aux_loss_coef")
    if coef < 0:
        raise ExpertsError(f"router_aux_loss_coef = {coef!r} is negative")
    width = "intermediate_size" if family == "mixtral" else "moe_intermediate_size"
    return HfMoe(
        experts=experts,
        top_k=top_k,
        ffn=_get(config, family, width),
        # MixtralSparseMoeBlock always divides the top-k weights by their sum
        norm_topk=family == "mixtral" or _get(config, family, "norm_topk_prob"),
        aux_coef=float(coef),
        sparse=sparse,
        shared_ffn=(
            _get(config, family, "shared_expert_intermediate_size") if family == "qwen2_moe" else 0
        ),
    )
