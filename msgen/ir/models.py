"""IR of a spec: what lowering resolves from the AST, before any check runs.

Values are evaluated (dims are ints, sizes are bytes), names are still names:
the check passes resolve and validate them. Every node keeps its span, and
each block keeps the span of each key (`spans`) so errors point at a line.

Lowering builds these models from values it has evaluated and checked, as trusted
data (`model_construct`), and their validators are built only when something
validates (`defer_build`): a check builds none, which keeps pydantic's validator
machinery and its plugin discovery out of every start (about 10 ms of a check).
tests/test_ir_types.py validates what lowering builds for every spec and case.
"""

# No `from __future__ import annotations` here: pydantic would compile every field's
# annotation back from its text each time msgen starts (about 1 ms of a check).

from pydantic import BaseModel, ConfigDict, Field

from msgen.diagnostics import Span
from msgen.ir.schema import Dtype, FusionKind, LossScale, RecomputeMode, Schedule

Split = tuple[tuple[str, ...], ...]
"""Per tensor dim, the mesh axes it is split over; () means whole."""


class Node(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)

    span: Span


class Block(Node):
    spans: dict[str, Span] = Field(default_factory=dict)


class Sharding(Node):
    dims: Split
    entry_spans: tuple[Span, ...] = ()
    """One per dim; the axes are as written, unknown ones included (the sharding
    pass checks them)."""


class TensorRef(Node):
    name: str


class Call(Node):
    """`adamw(lr = 3e-4, ...)` or `cosine(warmup = 2000, ...)`, or an
    op argument written as one (attention's `rope_scaling = llama3(factor = 8, ...)`)."""

    name: str
    args: dict[str, int | float | bool | str] = Field(default_factory=dict)
    arg_spans: dict[str, Span] = Field(default_factory=dict)


class OpNode(Node):
    """One statement of a layer or network: `name = kind(inputs, args) annots`.

    `inputs` are the tensor operands in order; `args` are the evaluated
    non-tensor arguments by name (dims, floats, bools, an op name for `tie`, or a
    `name(key = value, ...)` form).
    """

    name: str
    kind: str
    inputs: tuple[TensorRef, ...] = ()
    args: dict[str, int | float | bool | str | Call] = Field(default_factory=dict)
    arg_spans: dict[str, Span] = Field(default_factory=dict)
    out_sharding: Sharding | None = None
    param_shardings: dict[str, Sharding] = Field(default_factory=dict)


class TensorDecl(Node):
    name: str
    shape: tuple[int, ...]
    sharding: Sharding | None = None


class Graph(Node):
    """A `layer` (repeated) or the `network`; `output` names the op that ends it."""

    name: str
    input: TensorDecl | None
    ops: tuple[OpNode, ...] = ()
    output: str | None = None
    output_span: Span | None = None

    @property
    def total_layers(self) -> int:
        """The copies its `repeat` ops make, all together: the stack of repeated
        layers the pipeline splits."""
        return sum(op.args.get("count", 0) for op in self.ops if op.kind == "repeat")


class Model(Block):
    name: str
    dims: dict[str, int] = Field(default_factory=dict)
    dtype: Dtype = Dtype.FP32
    param_dtype: Dtype = Dtype.FP32


class Cluster(Block):
    device: str = ""
    per_node: int = 0
    nodes: tuple[str, ...] = ()
    device_ips: tuple[tuple[str, ...], ...] | None = None
    master_port: int = 8118
    device_ip_sources: tuple[str, ...] = ()
    """Files the device IPs were read from (relative to the spec): part of its hash."""
    node_spans: tuple[Span, ...] = ()
    """One per entry of `nodes`: the string's span."""
    device_ip_spans: tuple[tuple[Span, ...], ...] = ()
    """Per node, per device IP: the string's span, or the `hccn(...)` call's."""
    device_ip_files: tuple[str | None, ...] = ()
    """Per node: the hccn.conf its device IPs were read from, or None for a list."""


class Mesh(Block):
    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1  # expert parallel: carved out of dp, adds no devices

    def size(self, axis: str) -> int:
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, "ep": self.ep}.get(axis, 1)

    @property
    def devices(self) -> int:
        return self.dp * self.tp * self.pp


class Recompute(Node):
    layer: str
    mode: RecomputeMode
    ops: tuple[TensorRef, ...] = ()


class Pipeline(Block):
    micro_batches: int | None = None
    schedule: Schedule = Schedule.ONE_F_ONE_B
    chunks: int = 1
    split: tuple[int, ...] | None = None


class FusionGroup(Node):
    kind: FusionKind
    name: str
    patterns: tuple[str, ...]
    buckets: int = 1
    pattern_spans: tuple[Span, ...] = ()
    buckets_span: Span | None = None


class Checkpoint(Node):
    every: int
    keep: int


class Train(Block):
    micro_batch: int = 1
    global_batch: int = 1
    optimizer: Call | None = None
    schedule: Call | None = None
    zero: int = 0
    loss_scale: LossScale | str | None = None  # or a fixed number, as text
    grad_clip: float | None = None
    master_weights: Dtype | None = None
    grad_dtype: Dtype | None = None
    checkpoint: Checkpoint | None = None
    data: str | None = None  # the training MindRecord
    valid: str | None = None  # the validation MindRecord, from `mindrecord(..., valid = "...")`
    eval_every: int | None = None  # steps between validations; lowering sets a default with `valid`
    seed: int = 0
    log_every: int = 10  # steps between console lines (log.csv has every step)
    # output projections of repeated layers initialised with std 0.02 / sqrt(2 * layers)
    scaled_init: bool = True
    mtp: Call | None = None  # `mtp(depth = 1, weight = 0.1)`: multi-token prediction


class Budget(Block):
    device_memory: int | None = None  # bytes


class Spec(BaseModel):
    """The whole resolved spec."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    file: str
    sha256: str
    model: Model
    cluster: Cluster
    mesh: Mesh
    layers: dict[str, Graph] = Field(default_factory=dict)
    network: Graph
    recompute: dict[str, Recompute] = Field(default_factory=dict)
    pipeline: Pipeline
    fusion: tuple[FusionGroup, ...] = ()
    train: Train
    budget: Budget
    block_spans: dict[str, Span] = Field(default_factory=dict)

    @property
    def semi_auto(self) -> bool:
        """The ranks run MindSpore's semi-auto parallel, slicing what the mesh splits:
        any mesh but one that only splits the batch (tp = pp = ep = 1, zero = 0), which
        runs in data-parallel mode with every rank holding the whole model."""
        mesh = self.mesh
        return mesh.tp > 1 or mesh.pp > 1 or mesh.ep > 1 or self.train.zero > 0

    @property
    def loss_scale(self) -> str:
        """`train.loss_scale` as written, else its default: dynamic for fp16, none otherwise."""
        if self.train.loss_scale:
            return self.train.loss_scale
        return LossScale.DYNAMIC if self.model.dtype == Dtype.FP16 else LossScale.NONE

    @property
    def micro_batches(self) -> int:
        if self.pipeline.micro_batches is not None:
            return self.pipeline.micro_batches
        per_step = self.train.micro_batch * self.mesh.dp
        return max(1, self.train.global_batch // per_step) if per_step else 1
