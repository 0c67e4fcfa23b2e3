"""Multi-token prediction (`train.mtp`), as DeepSeek-V3 defines it (arXiv 2412.19437,
section 2.2): which network ops its modules share, and each module's own ops as the op
library defines them, so that the estimate, the plan and the emitted code read one
account of its parameters, saved tensors and work.

Module k = 1 .. D (index k - 1 in paths) takes h^{k-1} (h^0: what the output layer
reads, the main model's final norm output, as mindformers' GPTModel and vLLM's
DeepSeek MTP pass it) and the embedding of the token k positions ahead, and computes

    h'^k = eh_proj([enorm(Emb(t_{i+k})); hnorm(h^{k-1}_i)])     # [2h] -> [h], no bias
    h^k  = Block_k(h'^k)                                         # one copy of the layer
    P^k  = softmax(Head(norm_k(h^k)))                            # the shared output layer

with the embedding table and the output layer shared with the main model; enorm, hnorm
and norm_k (the checkpoint's `shared_head.norm`) are the module's own, of the kind and
eps of the main model's final norm. The order of the concatenation is the released
checkpoint's (embedding first: vLLM's deepseek_mtp.py, Megatron-LM's and mindformers'
MultiTokenPredictionLayer), not the paper's equation 21.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from msgen.analysis.facts import Facts, OpFacts, context
from msgen.ir.models import OpNode, Sharding, Spec, TensorRef
from msgen.ir.schema import MTP, with_defaults
from msgen.ops import OPS
from msgen.ops.base import Context, Param, Saved, Tensor

PREFIX = "mtp.layers"  # parameter paths: mtp.layers.<k>.<part>.<param>, as Megatron-LM's
NORMS = ("layernorm", "rmsnorm")


@dataclass(frozen=True)
class Shared:
    """The network ops every module shares or copies."""

    embedding: str  # the token embedding: its table
    norm: str  # the final norm: h^0 is its output; the module's norms are its kind and eps
    head: str  # the output layer
    loss: str  # the cross_entropy


@dataclass(frozen=True)
class Setting:
    depth: int
    weight: float  # lambda: the loss adds lambda / depth * sum of the modules' losses
    layer: str  # the repeated layer each module runs one copy of


def call_of(spec: Spec):
    """`train.mtp` as written, None when absent or `none`."""
    call = spec.train.mtp
    return None if call is None or call.name == "none" else call


def shared_ops(spec: Spec) -> Shared | None:
    """The ops a module shares, or None when the network does not end the way the
    module needs: `cross_entropy(logits, tokens)` over an output `linear` without a bias
    (or tied) over a layernorm or rmsnorm, and an `embedding` of the tokens."""
    net = spec.network
    ops = {op.name: op for op in net.ops}
    loss = ops.get(net.output or "")
    if net.input is None or loss is None or loss.kind != "cross_entropy":
        return None
    if len(loss.inputs) != 2 or loss.inputs[1].name != net.input.name:
        return None
    head = ops.get(loss.inputs[0].name)
    if head is None or head.kind != "linear" or not head.inputs:
        return None
    if not head.args.get("tie") and head.args.get("bias", True):
        return None
    norm = ops.get(head.inputs[0].name)
    if norm is None or norm.kind not in NORMS:
        return None
    emb = next(
        (op for op in net.ops if op.kind == "embedding" and op.inputs[0].name == net.input.name),
        None,
    )
    if emb is None:
        return None
    return Shared(emb.name, norm.name, head.name, loss.name)


def setting(spec: Spec) -> Setting | None:
    """The checked setting (checks/mtp.py holds the values to their ranges)."""
    call = call_of(spec)
    if call is None:
        return None
    args = with_defaults(MTP, "mtp", call.args)
    layer = args["layer"]
    if layer is None:
        layer = next(op.args["layer"] for op in reversed(spec.network.ops) if op.kind == "repeat")
    return Setting(int(args["depth"]), float(args["weight"]), str(layer))


@dataclass(frozen=True)
class Module:
    """One module's ops beside its block, as the op library sees them (the names are
    depth 0's; every depth has the same shapes, splits and parameters)."""

    setting: Setting
    shared: Shared
    embedding: OpFacts  # the shared table's lookup of the shifted tokens
    enorm: OpFacts
    hnorm: OpFacts
    eh_proj: OpFacts
    norm: OpFacts  # the module's own final norm (shared_head.norm)
    head: OpFacts  # the shared output layer over it
    loss: OpFacts

    @property
    def ops(self) -> tuple[OpFacts, ...]:
        """The ops outside the block, in forward order."""
        return (self.embedding, self.enorm, self.hnorm, self.eh_proj, self.norm, self.head,
                self.loss)  # fmt: skip

    def own_params(self, facts: Facts) -> list[tuple[str, Param]]:
        """(op path, param) of depth 0's own parameters, in model.py's order: enorm,
        hnorm, eh_proj, the block's, norm."""
        block = [
            (f"{PREFIX}.0.block.{op}", p)
            for op, of in facts.graphs[self.setting.layer].ops.items()
            for p in of.params
        ]
        head = [(f"{PREFIX}.0.{n}", p) for n in ("enorm", "hnorm", "eh_proj")
                for p in getattr(self, n).params]  # fmt: skip
        return head + block + [(f"{PREFIX}.0.norm", p) for p in self.norm.params]

    def saves(self) -> tuple[list[Saved], list[Saved]]:
        """What one module keeps for backward outside its block: (others, the loss's).
        hnorm's input is not among them: it is h^{k-1}, which the main output layer
        (k = 1) or the previous module's norm already keeps."""
        others = [s for of in self.ops[:-1] if of is not self.hnorm for s in of.saves]
        return others, list(self.loss.saves)


def _renamed(
    of: OpFacts, name: str, inputs: tuple[str, ...], tensors: list[Tensor], ctx: Context
) -> OpFacts:
    """A network op run again under another name on other tensors of the same shapes."""
    refs = tuple(TensorRef.model_construct(span=of.node.span, name=n) for n in inputs)
    return _facts(of.node.model_copy(update={"name": name, "inputs": refs}), tensors, ctx)


def _facts(node: OpNode, inputs: list[Tensor], ctx: Context) -> OpFacts:
    """An op's facts as msgen.analysis.graph.infer_layouts derives them."""
    opdef = OPS[node.kind]
    shape = opdef.shape(node, tuple(t.shape for t in inputs), ctx)
    layout = opdef.layout(node, inputs, shape, ctx)
    out = Tensor(shape, layout.output, opdef.output_itemsize or ctx.dtype_bytes)
    of = OpFacts(node=node, output=out, inputs=list(inputs), layout=layout)
    of.saves = opdef.saves(node, of.inputs, out, ctx)
    return of


def module(spec: Spec, facts: Facts) -> Module | None:
    """Depth 0's module, None without `train.mtp`."""
    chosen, shared = setting(spec), shared_ops(spec)
    if chosen is None or shared is None:
        return None
    net = facts.graphs["network"].ops
    tied = {n: of.params[0] for n, of in net.items() if of.node.kind in OPS
            and OPS[of.node.kind].tieable and of.params}  # fmt: skip
    ctx = context(spec, tied)
    p = f"{PREFIX}.0."
    norm = net[shared.norm]
    hidden = norm.output
    assert hidden is not None
    tokens = facts.graphs["network"].tensors[spec.network.input.name]
    emb = _renamed(net[shared.embedding], p + "embedding", (p + "tokens",), [tokens], ctx)
    enorm = _renamed(norm, p + "enorm", (p + "embedding",), [emb.output], ctx)
    hnorm = _renamed(norm, p + "hnorm", (shared.norm,), [hidden], ctx)
    out = hnorm.output
    joined = Tensor(out.shape[:-1] + (2 * out.shape[-1],), out.split, out.itemsize)
    proj = OpNode.model_construct(
        span=norm.node.span,
        name=p + "eh_proj",
        kind="linear",
        inputs=(TensorRef.model_construct(span=norm.node.span, name=p + "concat"),),
        args={"n": hidden.shape[-1], "bias": False},
        arg_spans={},
        out_sharding=None,
        param_shardings={"weight": eh_proj_sharding(spec, hidden.shape[-1], norm.node)},
    )
    eh_proj = _facts(proj, [joined], ctx)
    block = facts.graphs[chosen.layer].output
    own_norm = _renamed(norm, p + "norm", (p + "block",), [block], ctx)
    head = _renamed(net[shared.head], p + "head", (p + "norm",), [own_norm.output], ctx)
    loss = _renamed(
        net[shared.loss], p + "loss", (p + "head", p + "labels"), [head.output, tokens], ctx
    )
    return Module(chosen, shared, emb, enorm, hnorm, eh_proj, own_norm, head, loss)


def eh_proj_sharding(spec: Spec, hidden: int, near: OpNode) -> Sharding:
    """eh_proj is column parallel over tp when tp divides hidden (Megatron-LM's
    ColumnParallelLinear; its output is gathered back for the block), whole otherwise."""
    tp = spec.mesh.tp
    cols = ("tp",) if tp > 1 and hidden % tp == 0 else ()
    return Sharding.model_construct(span=near.span, dims=((), cols), entry_spans=())


def params_count(mod: Module, facts: Facts) -> int:
    """The modules' own parameters (the shared table and output layer not counted)."""
    return mod.setting.depth * sum(prod(p.shape) for _, p in mod.own_params(facts))
