"""What the model.py and train.py templates are rendered from.

The front end builds one `ModelContext` from the checked plan
(`build_context(plan)`); the templates read nothing else. Everything is plain
frozen data: ints, strings and tuples, so rendering is deterministic and the
module imports neither mindspore nor jinja2.

Conventions:
- Shapes are logical (whole-model) shapes, as MindSpore's semi-auto parallel
  wants them.
- A strategy is MindSpore's `Primitive.shard` argument: one int tuple per
  primitive input, e.g. `((dp, 1), (1, tp))` for a column-parallel MatMul; or, for
  a primitive the generated code lays by `Layout`s (a moe op's experts), one tensor
  map of axis names per input, e.g. `(("ep", "edp", "None"), ("ep", "None", "tp"))`.
- `OpSpec.strategies` maps a *role* (one primitive of the op; its op module's
  `strategies` says which) to its strategy. A role that is absent is not sharded
  (stand-alone layout).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from msgen.analysis.switches import Switches
from msgen.checks.reserved import camel
from msgen.emit.modes import TrainMode
from msgen.emit.ops import EMITTERS
from msgen.ops import OPS
from msgen.ops.base import Strategy

# (first copy, end copy, fusion id): copies first .. end - 1 of a layer parameter
FusionRuns = tuple[tuple[int, int, int], ...]


@dataclass(frozen=True)
class ParamSpec:
    """One parameter of an op; its path is `<layer>.<copy>.<op>.<name>` or `<op>.<name>`."""

    name: str  # weight, bias, table, gamma, beta
    shape: tuple[int, ...]  # logical shape
    init: str  # normal (std 0.02), zeros, ones
    decay: bool  # AdamW weight decay applies (not to norms and biases)


@dataclass(frozen=True)
class OpSpec:
    """One op; its output tensor, its attribute and its parameter-path segment share `name`.

    `inputs` are tensor names or, for add/mul, float constants.
    """

    name: str
    kind: str
    inputs: tuple[str | float, ...]
    params: tuple[ParamSpec, ...] = ()
    strategies: tuple[tuple[str, Strategy], ...] = ()
    recompute: bool = False  # selective recompute of this op
    stage: int = 0  # pipeline stage; network ops only (layer ops: the copy's)
    segment: int = 0  # pipeline segment (interleaved model chunk), like `stage`
    # what the op's code needs beyond the above (its op module's `settings`)
    settings: tuple[tuple[str, object], ...] = ()
    # repeat: `count` copies of `layer`; `placement` runs (first, end, stage, segment):
    # copies first .. end - 1 run on that pipeline stage and segment
    layer: str | None = None
    count: int = 0
    placement: tuple[tuple[int, int, int, int], ...] = ()

    def strategy(self, role: str) -> Strategy:
        found = dict(self.strategies).get(role)
        if found is None:
            raise ValueError(f"op {self.name!r} ({self.kind}) has no {role!r} strategy")
        return found

    def setting(self, key: str):
        return dict(self.settings).get(key)


@dataclass(frozen=True)
class LayerSpec:
    """A `layer` block: one nn.Cell class, instantiated once per repeat copy."""

    name: str
    input: str
    output: str  # name of the op whose result the layer returns
    ops: tuple[OpSpec, ...]
    recompute: bool = False  # full recompute of every copy

    @property
    def class_name(self) -> str:
        return camel(self.name)


@dataclass(frozen=True)
class NetworkSpec:
    """The `network` block: tokens in, scalar loss out (cross_entropy is the last op)."""

    input: str  # token ids; the labels are the second construct argument
    output: str
    ops: tuple[OpSpec, ...]


@dataclass(frozen=True)
class MtpSpec:
    """Multi-token prediction's modules in model.py (msgen/emit/mtp.py writes them)."""

    depth: int
    weight: float
    layer: str  # the repeated layer each module runs one copy of
    hidden: str  # h^0: the final norm's output; the modules' norms are copies of it
    embedding: str  # the network op whose table the modules share
    head: str  # the output layer's op
    loss: str  # the cross_entropy op (the network's output)
    eh_proj: OpSpec
    concat: Strategy
    ids: tuple[int, ...]  # the token ids' split as one strategy entry, e.g. (dp, 1)
    gather: Strategy
    rows: tuple[int, ...]  # the per-position losses' split, [batch, seq]
    stage: int = 0
    segment: int = 0


@dataclass(frozen=True)
class TrainSpec:
    micro_batch: int
    global_batch: int
    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    warmup: int
    steps: int
    min_lr: float
    zero: int = 0  # 0-3
    loss_scale: str = "none"  # dynamic | static | none
    loss_scale_value: float = 1.0  # static: the fixed scale
    grad_clip: float | None = None
    checkpoint_every: int | None = None
    checkpoint_keep: int = 5
    data: str | None = None  # MindRecord path; none: only --synthetic runs
    valid: str | None = None  # validation MindRecord path
    eval_every: int | None = None  # steps between validations (with `valid`)
    seed: int = 0
    log_every: int = 10  # steps between console lines


@dataclass(frozen=True)
class ModelContext:
    name: str
    spec_path: str  # posix path for the header
    spec_sha256: str
    dtype: str  # compute dtype: fp32 | fp16 | bf16
    param_dtype: str
    vocab: int
    seq: int
    dp: int
    tp: int
    pp: int
    # ranks between neighbours along dp and along the pipeline, as the mesh's owner
    # (msgen/ir/mesh.py) orders the ranks: train.py reads them, not the formula
    dp_stride: int
    pp_stride: int
    micro_batches: int
    schedule: str  # 1f1b | gpipe | interleaved
    layers: tuple[LayerSpec, ...]
    network: NetworkSpec
    train: TrainSpec
    mode: TrainMode  # the step's wiring, reducer and loss scaling (msgen/emit/modes.py)
    chunks: int = 1  # interleaved: model chunks (pipeline segments) per stage
    # the device memory budget as MindSpore's set_memory(max_size=...) takes it ("58GB");
    # the default is its own (all the device has)
    max_device_memory: str = "1024GB"
    # MFU's terms: the model FLOPs of one step over all devices (msgen estimate's
    # model_flops_per_step) and the device's dense bf16/fp16 matmul peak
    model_flops_per_step: int = 0
    device: str = ""
    peak_flops: float = 0.0
    # Comm fusion ids other than 1 (MindSpore's default): network parameter path -> id,
    # and per repeated layer, per `op.param` of one copy, runs of copies sharing an id.
    fusion: tuple[tuple[str, int], ...] = field(default=())
    layer_fusion: tuple[tuple[str, tuple[tuple[str, FusionRuns], ...]], ...] = field(default=())
    # Where a step of micro-batches reads each parameter's gradient under semi-auto
    # parallel: (path pattern, "mirror" | "accu_grads"), msgen/analysis/gradients.py
    gradient_from: tuple[tuple[str, str], ...] = field(default=())
    # The comment lines saying which --set flags the tree was compiled with (none: none)
    compiled_with: tuple[str, ...] = field(default=())
    # the performance switches train.py sets (msgen/analysis/switches.py)
    switches: Switches = field(default=Switches(None, ()))
    mtp: MtpSpec | None = None  # multi-token prediction (train.mtp)

    @property
    def class_name(self) -> str:
        return camel(self.name)

    @property
    def accumulates(self) -> bool:
        """A step runs several micro-batches (pipeline or gradient accumulation): the
        network is unrolled once per micro-batch, and semi-auto parallel accumulates the
        gradients in `accu_grads` (train.py's GradReducer)."""
        return self.pp > 1 or self.micro_batches > 1

    @property
    def dropout(self) -> bool:
        """Some op drops out (its `p` setting is above 0): model.py seeds each dropout
        primitive (dropout_seeds)."""
        return any((op.setting("p") or 0) > 0 for op in self.ops())

    @property
    def fused(self) -> bool:
        """Some op runs a fused kernel on Ascend (a role of its strategies is one of its
        op's `fused_roles`): model.py defines fused_kernels(), which chooses the path."""
        return any(
            role in OPS[op.kind].fused_roles for op in self.ops() for role, _ in op.strategies
        )

    @property
    def aux_losses(self) -> bool:
        """Some op adds an auxiliary loss (its `Snippet.aux`: moe's `aux_loss` or
        `z_loss` above 0): the network's loss includes it, and train.py logs it
        (log.csv's aux_loss)."""
        return any(EMITTERS[op.kind].code(op, self).aux for op in self.ops())

    @property
    def expert_bias(self) -> bool:
        """Some moe op has a correction bias (its `bias_rate` setting): train.py moves
        it after each step (model.py's update_expert_bias)."""
        return any(op.kind == "moe" and op.setting("bias_rate") is not None for op in self.ops())

    @property
    def logged_losses(self) -> tuple[tuple[str, str], ...]:
        """The loss's terms train.py logs beside it: (log.csv column, the network's
        attribute whose `total` sums the term over a step's micro-batches)."""
        terms = (("aux_loss", "add_aux"),) if self.aux_losses else ()
        return terms + ((("mtp_loss", "mtp"),) if self.mtp is not None else ())

    @property
    def lazy_inline(self) -> bool:
        """On Ascend an accumulating network is compiled once instead of once per
        micro-batch."""
        return self.accumulates

    def layer(self, name: str) -> LayerSpec:
        return next(layer for layer in self.layers if layer.name == name)

    def first_parameter(self) -> str:
        """The path of the first parameter, in MindSpore's order (a docstring example)."""
        for op in self.network.ops:
            if op.kind == "repeat":
                assert op.layer is not None
                for inner in self.layer(op.layer).ops:
                    if inner.params and op.count:
                        return f"{op.layer}.0.{inner.name}.{inner.params[0].name}"
            elif op.params:
                return f"{op.name}.{op.params[0].name}"
        return ""

    def no_decay_patterns(self) -> tuple[str, ...]:
        """fnmatch patterns of the parameters AdamW must not decay."""
        out: list[str] = []
        for op in self.network.ops:
            if op.kind == "repeat":
                assert op.layer is not None
                for inner in self.layer(op.layer).ops:
                    pats = (f"{op.layer}.*.{inner.name}.{p.name}" for p in inner.params)
                    out.extend(pat for pat, p in zip(pats, inner.params) if not p.decay)
            else:
                out.extend(f"{op.name}.{p.name}" for p in op.params if not p.decay)
        if self.mtp is not None:  # the modules' norms and their block's
            norm = next(op for op in self.network.ops if op.name == self.mtp.hidden)
            parts = [(part, norm) for part in ("enorm", "hnorm", "norm")]
            parts += [(f"block.{op.name}", op) for op in self.layer(self.mtp.layer).ops]
            out.extend(f"mtp.layers.*.{part}.{p.name}" for part, op in parts
                       for p in op.params if not p.decay)  # fmt: skip
        return tuple(dict.fromkeys(out))

    def ops(self) -> tuple[OpSpec, ...]:
        """Every op with code of its own: the network's and its layers', no repeat."""
        ops = (*self.network.ops, *(op for layer in self.layers for op in layer.ops))
        return tuple(op for op in ops if op.kind != "repeat")
