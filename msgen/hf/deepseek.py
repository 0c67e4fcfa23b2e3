"""DeepSeek-V2 and DeepSeek-V3 from Hugging Face: the multi-head latent attention and
the routing their config.json says, as transformers 4.57 builds and runs them
(models/deepseek_v2/configuration_deepseek_v2.py, modeling_deepseek_v2.py;
models/deepseek_v3/configuration_deepseek_v3.py, modeling_deepseek_v3.py), in msgen's
`mla` and `moe` terms. Keys a config leaves out take those files' defaults.

What transformers 4.57 runs, whatever else the config says:

- Layers `first_k_dense_replace` and after have experts, the ones before the dense
  MLP (DecoderLayer: `layer_idx >= first_k_dense_replace`); `moe_layer_freq` is not
  read.
- DeepSeek-V3 (DeepseekV3TopkRouter): sigmoid scores, the correction bias
  `e_score_correction_bias` added for the choice only, the experts in `n_group`
  groups of which the `topk_group` with the best sum of their two best biased scores
  are kept, the chosen unbiased scores divided by their sum (+1e-20) when
  `norm_topk_prob`, times `routed_scaling_factor`. `scoring_func` and `topk_method`
  are not read.
- DeepSeek-V2 (DeepseekV2MoEGate): a softmax over the experts; `topk_method` `greedy`
  (the top k) or `group_limited_greedy` (the `topk_group` groups with the best
  single score); the weights never renormalised (`norm_topk_prob` is not read),
  times `routed_scaling_factor`; its softmax attention scale without yarn's mscale
  (msgen's `yarn_mscale = false`).
- Neither adds an auxiliary loss to the loss (`aux_loss_alpha`, `seq_aux` are not
  read), so the imported spec has none.
- Shared experts: one MLP of width `moe_intermediate_size * n_shared_experts`, no gate.
- `num_nextn_predict_layers` is not read (transformers builds no multi-token
  prediction layer and skips layer 61's tensors on load); DeepSeek's checkpoints hold
  that many layers after the main ones, which msgen imports as `train.mtp`'s modules
  (absent: 0, what a checkpoint transformers saved holds).
"""

from __future__ import annotations

from dataclasses import dataclass

from msgen.base.readers import Bool, Int, Nullable, Num, Str
from msgen.base.status import UsageError
from msgen.hf.experts import HfMoe
from msgen.lowering.evaluate import DIM_LIMIT

_DIM = Int(1, DIM_LIMIT - 1)
_COUNT = Int(0, DIM_LIMIT - 1)
KEYS = {
    "q_lora_rank": Nullable(_DIM),
    "kv_lora_rank": _DIM,
    "qk_nope_head_dim": _DIM,
    "qk_rope_head_dim": _DIM,
    "v_head_dim": _DIM,
    "rope_interleave": Bool(),
    "mlp_bias": Bool(),
    "n_routed_experts": _DIM,
    "n_shared_experts": Nullable(_COUNT),
    "num_experts_per_tok": Nullable(_DIM),
    "moe_intermediate_size": _DIM,
    "first_k_dense_replace": _COUNT,
    "moe_layer_freq": Int(),
    "n_group": Nullable(_DIM),
    "topk_group": Nullable(_DIM),
    "routed_scaling_factor": Num(0.0, None),
    "norm_topk_prob": Bool(),
    "topk_method": Str(max_len=64),
    "scoring_func": Str(max_len=64),
    "aux_loss_alpha": Num(),
    "seq_aux": Bool(),
    "ep_size": Int(),
    "num_nextn_predict_layers": _COUNT,
    "intermediate_size": _DIM,
}
# transformers 4.57's defaults for a key config.json leaves out
DEFAULTS = {
    "deepseek_v2": {
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "n_routed_experts": 64,
        "n_shared_experts": 2,
        "num_experts_per_tok": None,
        "moe_intermediate_size": 1407,
        "first_k_dense_replace": 0,
        "n_group": None,
        "topk_group": None,
        "routed_scaling_factor": 1.0,
        "topk_method": "greedy",
        "mlp_bias": False,
        "intermediate_size": 11008,
        "rope_interleave": True,  # DeepseekV2's rope is always the interleaved pairs
    },
    "deepseek_v3": {
        "q_lora_rank": 1536,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 2048,
        "first_k_dense_replace": 3,
        "n_group": 8,
        "topk_group": 4,
        "routed_scaling_factor": 2.5,
        "norm_topk_prob": True,
        "mlp_bias": False,
        "rope_interleave": True,
        "intermediate_size": 18432,
    },
}


class DeepseekError(UsageError):
    """A DeepSeek config msgen cannot mean (status 2, one line naming the key)."""


@dataclass(frozen=True)
class HfMla:
    """The latent attention's sizes (msgen's `mla` arguments)."""

    q_lora_rank: int | None
    kv_lora_rank: int
    nope: int
    rope: int
    v: int
    interleave: bool
    yarn_mscale: bool

    @property
    def qk(self) -> int:
        return self.nope + self.rope

    def params(self, hidden: int, heads: int) -> int:
        """q (or q_a, its norm, q_b), kv_a, its norm, kv_b and o, as the Attention
        modules hold them (no biases)."""
        if self.q_lora_rank is None:
            q = hidden * heads * self.qk
        else:
            q = hidden * self.q_lora_rank + self.q_lora_rank * (1 + heads * self.qk)
        kv = hidden * (self.kv_lora_rank + self.rope) + self.kv_lora_rank
        kv += self.kv_lora_rank * heads * (self.nope + self.v)
        return q + kv + heads * self.v * hidden


def get(config: dict, family: str, key: str):
    """A key's value, transformers' default where the config leaves it out. (A null
    stays null where transformers keeps it so: q_lora_rank, n_group, topk_group.)"""
    return config[key] if key in config else DEFAULTS[family].get(key)


def mla_of(config: dict, family: str) -> HfMla:
    if config.get("attention_bias", False):
        raise DeepseekError(
            "attention_bias is true: msgen's mla has no biases (DeepSeek's checkpoints have none)"
        )
    if get(config, family, "mlp_bias"):
        raise DeepseekError("mlp_bias is true: the imported MLP and experts have no biases")
    rope = get(config, family, "qk_rope_head_dim")
    if rope % 2:
        raise DeepseekError(f"qk_rope_head_dim = {rope} is odd: rope rotates pairs")
    return HfMla(
        q_lora_rank=get(config, family, "q_lora_rank"),
        kv_lora_rank=get(config, family, "kv_lora_rank"),
        nope=get(config, family, "qk_nope_head_dim"),
        rope=rope,
        v=get(config, family, "v_head_dim"),
        interleave=family == "deepseek_v2" or get(config, family, "rope_interleave"),
        yarn_mscale=family == "deepseek_v3",
    )


@dataclass(frozen=True)
class Routing:
    """DeepSeek's routing in the moe op's arguments (msgen.ops.moe_routing)."""

    router: str  # softmax (V2) or sigmoid (V3)
    expert_bias: bool  # V3's e_score_correction_bias
    groups: int
    top_groups: int
    group_score: str  # top2 (V3) or max (V2's group_limited_greedy)
    scaling: float

    def arguments(self) -> str:
        """The moe op's routing arguments past its defaults."""
        out = "" if self.router == "softmax" else f", router = {self.router}"
        out += ", expert_bias = true" if self.expert_bias else ""
        if self.top_groups < self.groups:
            out += f", expert_groups = {self.groups}, top_groups = {self.top_groups}"
            out += "" if self.group_score == "top2" else f", group_score = {self.group_score}"
        return out + ("" if self.scaling == 1.0 else f", routed_scaling = {self.scaling!r}")


def routing_of(config: dict, family: str, experts: int) -> Routing:
    scaling = float(get(config, family, "routed_scaling_factor"))
    if scaling <= 0:
        raise DeepseekError(f"routed_scaling_factor = {scaling!r} is not positive")
    if family == "deepseek_v3":
        groups, top = get(config, family, "n_group"), get(config, family, "topk_group")
        if groups is None or top is None:
            raise DeepseekError("n_group and topk_group are null: DeepseekV3's router needs both")
        router, bias, score = "sigmoid", True, "top2"
    else:
        method = get(config, family, "topk_method")
        router, bias = "softmax", False
        if method == "greedy":
            groups, top, score = 1, 1, "max"
        elif method == "group_limited_greedy":
            groups, top = get(config, family, "n_group"), get(config, family, "topk_group")
            if groups is None or top is None:
                raise DeepseekError("topk_method group_limited_greedy needs n_group and topk_group")
            score = "max"
        else:
            raise DeepseekError(
                f"topk_method {method!r}: transformers' DeepseekV2 routes by greedy or "
                "group_limited_greedy only"
            )
    if experts % groups:
        raise DeepseekError(f"n_group = {groups} does not divide n_routed_experts = {experts}")
    if not 1 <= top <= groups:
        raise DeepseekError(f"topk_group = {top} must be between 1 and n_group = {groups}")
    return Routing(router, bias, groups, top, score, scaling)


def sparse_of(config: dict, family: str, layers: int) -> tuple[bool, ...]:
    first = get(config, family, "first_k_dense_replace")
    return tuple(i >= first for i in range(layers))


def moe_of(config: dict, family: str, layers: int) -> HfMoe | None:
    """The experts of a DeepSeek config; None when first_k_dense_replace leaves every
    layer dense."""
    experts = get(config, family, "n_routed_experts")
    top_k = get(config, family, "num_experts_per_tok")
    if top_k is None:
        raise DeepseekError("num_experts_per_tok is null: DeepseekV2's router needs it")
    sparse = sparse_of(config, family, layers)
    if not any(sparse):
        return None
    if top_k > experts:
        raise DeepseekError(
            f"num_experts_per_tok = {top_k} is more than n_routed_experts = {experts}"
        )
    shared = get(config, family, "n_shared_experts")
    if not shared:
        raise DeepseekError(
            "n_shared_experts is null or 0: transformers' DeepseekV2MoE and DeepseekV3MoE "
            "always run their shared experts"
        )
    width = get(config, family, "moe_intermediate_size")
    return HfMoe(
        experts=experts,
        top_k=top_k,
        ffn=width,
        norm_topk=family == "deepseek_v3" and bool(get(config, family, "norm_topk_prob")),
        aux_coef=0.0,
        sparse=sparse,
        shared_ffn=width * shared,
        shared_sigmoid=False,
        routing=routing_of(config, family, experts),
    )


def mtp_of(config: dict, family: str, layers: int) -> int:
    """The multi-token prediction layers a DeepSeek checkpoint holds after its main
    layers. Each is a decoder layer of index num_hidden_layers + i, with experts by
    first_k_dense_replace as any layer; msgen's modules run a copy of the last main
    layer's kind, so a module layer of another sort is refused."""
    depth = config.get("num_nextn_predict_layers") or 0
    first = get(config, family, "first_k_dense_replace")
    if depth and layers <= first < layers + depth:  # layer `first` has experts, L - 1 not
        raise DeepseekError(
            f"first_k_dense_replace = {first} gives the multi-token prediction layers "
            f"another kind than the last of the {layers} main layers: msgen's mtp runs "
            "a copy of a main layer's kind"
        )
    return depth
