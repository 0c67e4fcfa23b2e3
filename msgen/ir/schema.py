"""The settings schema, one home for what a spec may say outside its graphs: the
blocks, each block's keys and which are required, the optimizer and learning-rate
schedule signatures with their defaults, and the enumerated values. Lowering, the
checks, emission and the docs test (tests/test_docs.py keeps docs/language.md's
tables in step) read it; a key's default when not written is its field's default
in msgen.ir.models.
"""

from __future__ import annotations

from enum import StrEnum


class Dtype(StrEnum):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"


DTYPE_BYTES = {Dtype.FP32: 4, Dtype.FP16: 2, Dtype.BF16: 2}


class RecomputeMode(StrEnum):
    FULL = "full"
    SELECT = "select"
    NONE = "none"


class Schedule(StrEnum):
    """The pipeline schedule (`pipeline.schedule`)."""

    ONE_F_ONE_B = "1f1b"
    GPIPE = "gpipe"
    INTERLEAVED = "interleaved"


class LossScale(StrEnum):
    """`train.loss_scale` by name; a fixed scale is written as a number."""

    DYNAMIC = "dynamic"
    NONE = "none"


class FusionKind(StrEnum):
    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    REDUCESCATTER = "reducescatter"


REQUIRED = object()  # an argument or key with no default

REQUIRED_BLOCKS = ("model", "cluster", "mesh", "network", "train")
SINGLE_BLOCKS = (
    "model",
    "cluster",
    "mesh",
    "network",
    "recompute",
    "pipeline",
    "fusion",
    "train",
    "budget",
)
BLOCK_KINDS = SINGLE_BLOCKS + ("layer",)

# The keys of the blocks written `key = value`, and whether each is required. In
# `model` every other name is a dim; these are the ones it must have.
MODEL_REQUIRED = ("vocab", "hidden", "heads", "layers", "seq")
MODEL_SETTINGS = ("dtype", "param_dtype")
# The model keys msgen reads by name; any other name in `model` is a free dim.
MODEL_KEYS = MODEL_REQUIRED + ("ffn", "kv_heads", "head_dim") + MODEL_SETTINGS
KEYS = {
    "cluster": {"device": True, "per_node": True, "nodes": True, "device_ips": False,
                "master_port": False},
    "mesh": {"dp": True, "tp": True, "pp": False, "ep": False},
    "pipeline": {"micro_batches": False, "schedule": False, "split": False},
    "train": {"micro_batch": True, "global_batch": True, "optimizer": True, "schedule": True,
              "zero": False, "loss_scale": False, "grad_clip": False, "master_weights": False,
              "grad_dtype": False, "checkpoint": False, "data": False, "seed": False,
              "log_every": False, "scaled_init": False, "eval_every": False,
              "mtp": False},
    "budget": {"device_memory": False},
}  # fmt: skip

# Steps between validations when the data names a valid set and eval_every is not
# written: Megatron-LM's --eval-interval default.
EVAL_EVERY = 1000

# Keyword arguments and defaults of `train.optimizer` and `train.schedule`.
OPTIMIZERS: dict[str, dict[str, object]] = {
    "adamw": {"lr": REQUIRED, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0},
}
SCHEDULES: dict[str, dict[str, object]] = {
    "cosine": {"warmup": 0, "steps": REQUIRED, "min_lr": 0.0},
    "constant": {"warmup": 0},
}


# Keyword arguments and defaults of `train.mtp`, DeepSeek-V3's multi-token prediction:
# `depth` modules (num_nextn_predict_layers, Megatron-LM's mtp_num_layers), the loss
# weight lambda (Megatron-LM's mtp_loss_scaling_factor default), and the repeated layer
# each module runs once (none: the layer of the network's last repeat).
MTP: dict[str, dict[str, object]] = {"mtp": {"depth": 1, "weight": 0.1, "layer": None}}


def with_defaults(table: dict[str, dict[str, object]], name: str, args: dict) -> dict:
    """A call's arguments as written, over its signature's defaults."""
    defaults = {k: v for k, v in table[name].items() if v is not REQUIRED}
    return defaults | dict(args)


def signature(name: str, args: dict[str, object]) -> str:
    """`adamw(lr, beta1 = 0.9, ...)`, as the docs write it."""

    def value(d) -> str:
        if not isinstance(d, float):
            return str(d)
        text = f"{d:g}".replace("e-0", "e-")
        return text if "." in text or "e" in text else text + ".0"

    parts = [a if d is REQUIRED else f"{a} = {value(d)}" for a, d in args.items()]
    return f"{name}({', '.join(parts)})"
