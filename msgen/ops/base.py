"""What every op in the library declares, and the helpers they share.

An op is one class in one module: its arguments, shape inference, parameters, the
layout (sharding) it computes at and the collectives that implies, the tensors it
saves for backward, its FLOPs, its recompute rule, and the MindSpore shard strategies
of its primitives (read by plan.json and the strategy files as well as the code).
How today's backend writes the op (its settings, code and helper cells) is the
backend's: msgen/emit/ops, one emitter per op kind. What the code imports
(`imports`) stays here while the reserved-name check (msgen/checks/reserved.py, a
layer below the backend) reads it.
The registry (msgen.ops) finds every op class in the package's modules, so adding
an op is adding its module. Splits are per-dim tuples of mesh axes (see
`ir.models.Split`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import ClassVar

from msgen.ir.fieldwise import Fieldwise
from msgen.ir.models import OpNode, Split
from msgen.ir.schema import REQUIRED


@dataclass(frozen=True)
class Arg:
    name: str
    # tensor | int | float | bool | op | name (one of `choices`) | call (`name(key = value)`,
    # an ir.Call the op checks)
    kind: str
    default: object = REQUIRED
    within: str | None = None  # a float's interval, "[0, 1)" or "(0, inf)" (MSL126)
    choices: tuple[str, ...] = ()  # a name's allowed values

    def allows(self, value: float) -> bool:
        low, high = (float(end) for end in self.within[1:-1].split(","))
        above = value >= low if self.within[0] == "[" else value > low
        below = value <= high if self.within[-1] == "]" else value < high
        return above and below


@dataclass(frozen=True)
class Tensor:
    """A tensor as an op sees it: logical shape, split, element size in bytes."""

    shape: tuple[int, ...]
    split: Split
    itemsize: int


@dataclass(frozen=True)
class Param:
    name: str
    shape: tuple[int, ...]
    split: Split


@dataclass(frozen=True)
class Collective:
    kind: str  # AllReduce | AllGather | ReduceScatter | AllToAll
    axes: tuple[str, ...]
    elements: int  # logical elements of the tensor it moves (per micro-batch)
    what: str
    operand: int | None = None  # an AllGather of this input is the op's own, not implicit
    # backward: the op's matmuls wait for it, so the weight gradient cannot hide it (a
    # matmul fused with it still may: the device's tp_overlap)
    blocking: bool = False
    # nothing hides it, forward or backward: the next kernel waits for it and no matmul
    # is fused with it (moe's all-to-alls)
    exposed: bool = False


@dataclass(frozen=True)
class Saved:
    """A tensor kept for backward. `key` is a tensor name when the op saves one of
    its operands or its output (so several consumers count it once), else
    `<op>.<what>` for a tensor of the op's own."""

    key: str
    shape: tuple[int, ...]
    split: Split
    itemsize: int
    role: str  # input | output | internal


@dataclass(frozen=True)
class Work(Fieldwise):
    """The forward work of one run of an op over its logical (whole-model) tensors,
    per micro-batch: matrix multiplies as FLOPs (2mnk), the rest as the bytes its
    memory-bound kernels read and write (elementwise, norms, softmax)."""

    matmul_flops: int = 0  # model FLOPs: Korthikanti's convention, causal attention whole
    kernel_flops: int = 0  # what the kernels compute (a causal flash kernel skips half)
    memory_bytes: int = 0


def matmul(flops: int) -> Work:
    """A matrix multiply the kernel computes in full."""
    return Work(matmul_flops=flops, kernel_flops=flops)


def tensor_bytes(t: Tensor) -> int:
    return prod(t.shape) * t.itemsize


@dataclass(frozen=True)
class Layout:
    """How an op runs: the split each input must have (an implicit
    redistribution goes in front when the producer gave another), its
    parameters' splits, its output split and the collectives that implies."""

    inputs: tuple[Split, ...]
    output: Split
    params: tuple[Param, ...] = ()
    collectives: tuple[Collective, ...] = ()
    # Mesh axes that split the op's work inside it beyond what its tensors' splits say
    # (a region that hands each tp rank tokens of its own: the dropless moe).
    within: tuple[str, ...] = ()


class OpError(Exception):
    """A shape or layout rule an op's operands break; `at` names the argument
    (or `@`, or a parameter) whose span the diagnostic should point at."""

    def __init__(self, code: str, message: str, at: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.at = at
        self.hint = hint


@dataclass(frozen=True)
class Context:
    """What ops may consult beyond their operands."""

    mesh_sizes: dict[str, int]
    dims: dict[str, int]
    dtype_bytes: int
    tied: dict[str, Param] = field(default_factory=dict)  # op name -> its table
    semi_auto: bool = False  # Spec.semi_auto: the ranks run semi-auto parallel


def whole(rank: int) -> Split:
    return tuple(() for _ in range(rank))


def split_factor(axes: tuple[str, ...], ctx: Context) -> int:
    return prod(ctx.mesh_sizes.get(a, 1) for a in axes)


def declared(node: OpNode, param: str, rank: int) -> Split:
    sharding = node.param_shardings.get(param)
    return sharding.dims if sharding is not None and len(sharding.dims) == rank else whole(rank)


def out_declared(node: OpNode, rank: int) -> Split | None:
    s = node.out_sharding
    return s.dims if s is not None and len(s.dims) == rank else None


Strategy = tuple[tuple[int, ...], ...]  # MindSpore's `Primitive.shard` argument


def factors(split: Split, ctx: Context) -> tuple[int, ...]:
    """A split as a strategy entry: the number of slices of each dim."""
    return tuple(split_factor(axes, ctx) for axes in split)


def lead(split: Split, ctx: Context) -> int:
    """Leading dims folded into one, as a [batch*seq, features] matmul sees them."""
    return prod(factors(split[:-1], ctx))


class OpDef:
    name: ClassVar[str]
    args: ClassVar[tuple[Arg, ...]]
    params: ClassVar[tuple[str, ...]] = ()  # names `param @ [...]` may shard
    # What its code and its helper cells import, written as the Python lines would be
    # ("from mindspore import nn, ops"), and what a setting adds when it is true;
    # generated model.py imports the union over its ops (msgen/ops/imports.py).
    imports: ClassVar[tuple[str, ...]] = ()
    setting_imports: ClassVar[dict[str, tuple[str, ...]]] = {}
    # Each parameter's initialiser (normal: std 0.02, zeros, ones), and those AdamW
    # decays (matrices; norms and biases are left alone).
    inits: ClassVar[dict[str, str]] = {}
    decays: ClassVar[frozenset[str]] = frozenset()
    # A composite op is a Cell of several primitives in MindSpore; a primitive op is one
    # primitive, or a helper cell standing for one.
    composite: ClassVar[bool] = False
    # Its parameters may be shared by other ops (`linear(x, vocab, tie = emb)` reads
    # the embedding's table): the analysis keeps them by op name for those.
    tieable: ClassVar[bool] = False
    # The bytes of one element of its output when not the compute dtype's (a loss,
    # computed in fp32).
    output_itemsize: ClassVar[int | None] = None
    # Its weight starts scaled by depth (std 0.02 / sqrt(2 * layers), GPT-2 and
    # Megatron-LM's output layers) when its output reaches a residual join through ops
    # that only scale it: `residual_join`, `scales_only` below.
    output_layer: ClassVar[bool] = False
    # Its parameters stacked over experts: ep splits their first dim and nothing else
    # (msgen.checks.sharding), as the generated code splits them.
    expert_params: ClassVar[frozenset[str]] = frozenset()
    # The roles of `strategies` that are MindSpore fused kernels, by the primitive's
    # name: on Ascend the op's code runs that primitive with that strategy, elsewhere it
    # composes the same computation from basic primitives (the 2.10 CPU build registers
    # no kernel for RmsNorm, Swiglu or RotaryPositionEmbedding). plan.json and the
    # strategy files list them (`fused_kernels`); model.py's `fused_kernels()` chooses.
    fused_roles: ClassVar[dict[str, str]] = {}

    def arg(self, node: OpNode, name: str):
        """An argument as written, else its declared default."""
        if name in node.args:
            return node.args[name]
        return next(a.default for a in self.args if a.name == name)

    def tensor_args(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args if a.kind == "tensor")

    def shared_from(self, args: dict) -> dict[str, str]:
        """The ops whose parameters this one reads instead of owning its own, by the
        argument (of kind `op`, as linear's `tie = emb`) naming each."""
        return {
            a.name: args[a.name]
            for a in self.args
            if a.kind == "op" and isinstance(args.get(a.name), str)
        }

    def shape(self, node: OpNode, inputs: list[tuple[int, ...]], ctx: Context) -> tuple[int, ...]:
        raise NotImplementedError

    def param_shapes(
        self, node: OpNode, inputs: list[tuple[int, ...]], ctx: Context
    ) -> dict[str, tuple[int, ...]]:
        return {}

    def layout(self, node: OpNode, inputs: list[Tensor], out_shape, ctx: Context) -> Layout:
        """Default: elementwise; output split = the declared one, else the first input's."""
        out = out_declared(node, len(out_shape)) or inputs[0].split
        return Layout(inputs=tuple(align(out, t.shape) for t in inputs), output=out)

    def saves(
        self, node: OpNode, inputs: list[Tensor], output: Tensor, ctx: Context
    ) -> list[Saved]:
        return []

    @property
    def selected_drops_output(self) -> bool:
        """Whether `select(op)` drops the op's output as well as what it saves of its own.

        The one rule read by the estimate (which tensors stay saved) and by the emitter
        (how the op is marked). MindSpore's `Cell.recompute()` recomputes every primitive
        of a cell except its outputs (mindspore/nn/cell.py); `Primitive.recompute()` and
        `Cell.recompute(output_recompute=True)` recompute the output too. A primitive op
        is rerun in full from its inputs, so no consumer keeps its output; a composite op
        keeps its output, as MindSpore does for a Cell.
        """
        return not self.composite

    def residual_join(self, node: OpNode) -> bool:
        """Whether the op adds a branch into the residual stream (`x + branch`)."""
        return False

    def scales_only(self, node: OpNode) -> bool:
        """Whether the op only scales its one tensor operand (dropout, times a constant),
        so an output layer in front of it still feeds the residual join behind it."""
        return False

    # strategies ---------------------------------------------------------------

    def strategies(self, node: OpNode, layout: Layout, ctx: Context):
        """`(role, strategy)` per primitive of the op, from the layout the checks chose;
        a role that is absent is not sharded. Default: one role `x`, the first input's."""
        return (("x", (factors(layout.inputs[0], ctx),)),)

    def fused_kernels(self, node: OpNode, layout: Layout, ctx: Context):
        """`(primitive, strategy)` of each fused kernel the op runs on Ascend."""
        return tuple(
            (self.fused_roles[role], strategy)
            for role, strategy in self.strategies(node, layout, ctx)
            if role in self.fused_roles
        )

    def buffers(self, node: OpNode) -> dict[str, tuple[int, ...]]:
        """State the op keeps beside its parameters, by name: not trained (no gradient,
        no optimizer state, not in params_total), checkpointed and resharded whole
        (moe's correction bias). Default: none."""
        return {}

    def imports_of(self, op=None) -> tuple[str, ...]:
        """What one op's code imports, given the emitter's record of it (its settings);
        without one, what the op's code may import under any settings."""
        added = (v for k, v in self.setting_imports.items() if op is None or op.setting(k))
        return self.imports + tuple(line for lines in added for line in lines)

    def active_params(self, node: OpNode, params: tuple[Param, ...]) -> int:
        """Parameters one token's forward reads. Default: all of them."""
        return sum(prod(p.shape) for p in params)

    def divisible(self, node: OpNode, layout: Layout, ctx: Context):
        """Counts other than tensor dims that a split must divide: (what, n, axes)."""
        return []

    def work(self, node: OpNode, inputs: list[Tensor], output: Tensor, ctx: Context) -> Work:
        """Forward work. Default: memory-bound, reading every input and writing the output."""
        return Work(memory_bytes=sum(map(tensor_bytes, inputs)) + tensor_bytes(output))

    def backward_collectives(
        self, node: OpNode, inputs: list[Tensor], layout: Layout, ctx: Context
    ) -> tuple[Collective, ...]:
        """What backward communicates. Default: nothing (an elementwise op's
        gradient is as split as its output's; a forward AllReduce of a partial sum
        leaves a whole gradient that needs none)."""
        return ()

    def backward_work(self, node: OpNode, forward: Work) -> Work:
        """Backward: each matmul twice over (the input and the weight gradients);
        a memory-bound op reads its saved input and the incoming gradient and
        writes the outgoing one: three tensors where forward moved two."""
        return Work(
            2 * forward.matmul_flops, 2 * forward.kernel_flops, forward.memory_bytes * 3 // 2
        )


def align(split: Split, shape: tuple[int, ...]) -> Split:
    """The trailing part of `split` that applies to a (broadcast) operand of `shape`;
    a broadcast dim of size 1 stays whole."""
    tail = split[len(split) - len(shape) :] if len(shape) <= len(split) else split
    return tuple(() if n == 1 else s for n, s in zip(shape, tail, strict=False))


def saved_operand(name: str, t: Tensor) -> Saved:
    return Saved(key=name, shape=t.shape, split=t.split, itemsize=t.itemsize, role="input")


def replace_last(split: Split, last: tuple[str, ...]) -> Split:
    return tuple(split[:-1]) + (last,)


def partial_sum(out: Split, reduce_axes: tuple[str, ...], elements: int, what: str):
    """The collective that completes a matmul whose reduction dim is split over
    `reduce_axes`: a ReduceScatter when the output is split over exactly those
    axes on a non-last dim (sequence parallelism), else an AllReduce."""
    if not reduce_axes:
        return ()
    scattered = any(s == reduce_axes for s in out[:-1])
    kind = "ReduceScatter" if scattered else "AllReduce"
    return (Collective(kind, reduce_axes, elements, what),)
