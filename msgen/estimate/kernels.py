"""The kernels the time model prices: for each op with a fused Ascend kernel, the
fused primitive, the basic operators run instead, and what the basic path costs
beyond the fused one; which path the generated code of a spec takes; and the fused
kernels a published run used (its `kernels` in specs/validation/published.json), so
that the calibration prices each run as it ran.

An op's `work` (msgen.ops) is its fused kernel's: one kernel forward, two backward,
reading its inputs and writing its output once. The basic path runs `extra_kernels`
more kernels forward (twice as many backward) and moves `traffic` times the bytes.
Over a tensor of n elements:

- rmsnorm: RmsNorm reads x and writes y (2n); the basic path's Square (reads x,
  writes x^2), ReduceMean (reads x^2), Add and Rsqrt (on one value per row), Mul by
  the inverse (reads x, writes), Mul by gamma (reads, writes): 7n, 3.5 times, 5 more.
- swiglu over [gate | up] of 2m elements: Swiglu reads 2m and writes m (3m); the basic
  path's two StridedSlices (read and write m each: 4m), SiLU (2m) and Mul (reads 2m,
  writes m: 3m): 9m, 3 times, 3 more.
- rope: RotaryPositionEmbedding once each for q and k; rotate-half runs StridedSlice
  twice, Neg, Concat, Mul twice and Add on each: 12 more kernels. Its bytes stay
  those the attention op counts (ops/attention.py), which are the fused kernel's.
- flash attention: FlashAttentionScore or BatchMatMul, Softmax, BatchMatMul; the
  attention op's own work tells the two apart (its `flash` argument).
- mc2: AllGatherMatmul and MatmulReduceScatter for a tp-split MatMul and its
  collective (msgen/analysis/switches.py). Priced alike: the share of tp
  communication the matmuls hide is the device's fitted `tp_overlap`, fitted on a run
  (MindSpeed-LLM's LLaMA2-13B, tp 8) whose script asks for no MC2.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from msgen.analysis.facts import context
from msgen.analysis.plan import Plan
from msgen.analysis.switches import switches
from msgen.ir.devices import DEVICES
from msgen.ir.models import OpNode, Spec
from msgen.ops import OPS
from msgen.ops.base import Work


@dataclass(frozen=True)
class Kernel:
    name: str
    fused: str  # MindSpore 2.10's fused primitive
    basic: str  # the basic operators of the other path
    extra_kernels: int  # forward kernels the basic path runs beyond the fused one
    traffic: float  # the basic path's bytes over the fused kernel's


KERNELS = {
    k.name: k
    for k in (
        Kernel("rmsnorm", "RmsNorm", "Square, ReduceMean, Add, Rsqrt, Mul, Mul", 5, 3.5),
        Kernel("swiglu", "Swiglu", "StridedSlice x2, SiLU, Mul", 3, 3.0),
        Kernel("rope", "RotaryPositionEmbedding", "rotate-half (7 kernels each on q, k)", 12, 1.0),
        Kernel("flash", "FlashAttentionScore", "BatchMatMul, Softmax, BatchMatMul", 0, 1.0),
        Kernel(
            "mc2", "AllGatherMatmul, MatmulReduceScatter", "MatMul, then the collective", 0, 1.0
        ),
    )
}
ALL_FUSED = frozenset(KERNELS)


def op_kernels(node: OpNode) -> tuple[str, ...]:
    """The kernels of KERNELS an op runs one way or the other."""
    if node.kind in ("rmsnorm", "swiglu"):
        return (node.kind,)
    if node.kind == "attention":
        return tuple(k for k in ("rope", "flash") if node.args.get(k))
    return ()


def generated(plan: Plan) -> frozenset[str]:
    """The kernels the generated code of a plan runs fused: on an Ascend device, those
    whose primitive some op of the plan runs there (its op's `fused_kernels`, what
    model.py's fused_kernels() builds), and MC2 where its switch is set; none
    elsewhere, where the basic path runs."""
    spec = plan.spec
    device = DEVICES.get(spec.cluster.device)
    if device is None or device.target != "Ascend":
        return frozenset()
    ctx = context(spec)
    built = {
        primitive
        for name in ("network", *(r.layer for r in plan.repeats))
        for of in plan.graph(name).ops.values()
        if of.layout is not None and OPS[of.node.kind].fused_roles
        for primitive, _ in OPS[of.node.kind].fused_kernels(of.node, of.layout, ctx)
    }
    fused = {k.name for k in KERNELS.values() if k.fused in built}
    return frozenset(fused | ({"mc2"} if switches(plan).mc2 else set()))


def as_run(node: OpNode, fused: frozenset[str]) -> OpNode:
    """The op as its path runs it: an attention that asks for flash composes its scores
    in memory where the flash kernel does not run (the stand-in of
    templates/ops/attention.py.j2), and is priced so."""
    if node.kind == "attention" and node.args.get("flash") and "flash" not in fused:
        return node.model_copy(update={"args": {**node.args, "flash": False}})
    return node


def priced(node: OpNode, fwd: Work, fused: frozenset[str]) -> tuple[Work, int]:
    """An op's forward work and its extra forward kernels on the path `fused` says."""
    extra, traffic = 0, 1.0
    for name in op_kernels(node):
        if name not in fused:
            extra += KERNELS[name].extra_kernels
            traffic *= KERNELS[name].traffic
    if traffic != 1.0:
        fwd = replace(fwd, memory_bytes=round(fwd.memory_bytes * traffic))
    return fwd, extra


def paths(spec: Spec, fused: frozenset[str]) -> tuple[tuple[str, str], ...]:
    """(kernel, "fused" or "basic") for each kernel of KERNELS the spec runs one way or
    the other, in KERNELS' order: its ops' kernels, and mc2 where tp splits matmuls."""
    graphs = (spec.network, *spec.layers.values())
    used = {k for g in graphs for op in g.ops for k in op_kernels(op)}
    if spec.semi_auto and spec.mesh.tp > 1:
        used.add("mc2")
    return tuple((name, "fused" if name in fused else "basic") for name in KERNELS if name in used)
