"""What a stage keeps for backward per micro-batch, and what a recomputed layer
re-materialises in backward on top of it.

Every tensor comes from the ops' own saved-tensor rules (`OpDef.saves`) at the
sharding the analysis gave it; the rules are DESIGN.md's "Memory accounting
rules". Bytes are per device (one device stands for its stage: splits divide
evenly).
"""

from __future__ import annotations

from math import ceil, prod

from msgen.analysis.facts import GraphFacts
from msgen.analysis.plan import Plan
from msgen.ir.models import Recompute, Split
from msgen.ir.schema import RecomputeMode
from msgen.ops import OPS
from msgen.ops.base import Saved


def slice_shape(shape: tuple[int, ...], split: Split, sizes: dict[str, int]) -> tuple[int, ...]:
    """One device's slice: each dim divided by the axes splitting it (rounded up)."""
    return tuple(ceil(n / prod(sizes.get(a, 1) for a in axes)) for n, axes in zip(shape, split))


def saved_bytes(s: Saved, sizes: dict[str, int]) -> int:
    return prod(slice_shape(s.shape, s.split, sizes)) * s.itemsize


def recompute_label(rc: Recompute | None) -> str:
    if rc is None or rc.mode == RecomputeMode.NONE:
        return "none"
    if rc.mode == RecomputeMode.FULL:
        return "full"
    return f"select({', '.join(r.name for r in rc.ops)})"


def kept_saves(gf: GraphFacts, rc: Recompute | None) -> dict[str, Saved]:
    """What one copy of a layer keeps for backward after recompute, one entry per
    distinct tensor (by key), in op order.

    `full` keeps only the layer's input. `select(op, ...)` drops what the named
    ops save beyond their inputs and keeps those inputs instead; a named
    primitive op's output is recomputed too, so no consumer keeps it, while a
    named composite op (a Cell) keeps its output. An input that is itself the
    output of a named primitive is recomputed from that op's own inputs.
    """
    if rc is not None and rc.mode == RecomputeMode.FULL:
        decl = gf.graph.input
        t = gf.tensors[decl.name]
        return {decl.name: Saved(decl.name, t.shape, t.split, t.itemsize, "input")}
    named = (
        [r.name for r in rc.ops if r.name in gf.ops]
        if rc and rc.mode == RecomputeMode.SELECT
        else []
    )
    recomputed = {n for n in named if OPS[gf.ops[n].node.kind].selected_drops_output}
    kept: dict[str, Saved] = {}
    for name, of in gf.ops.items():
        for s in of.saves:
            if (name in named and s.role != "input") or s.key in recomputed:
                continue
            kept.setdefault(s.key, s)
    for name in named:
        of = gf.ops[name]
        for ref, t in zip(of.node.inputs, of.inputs):
            if ref.name not in recomputed:
                kept.setdefault(ref.name, Saved(ref.name, t.shape, t.split, t.itemsize, "input"))
    return kept


def layer_activation_bytes(gf: GraphFacts, rc: Recompute | None, sizes: dict[str, int]) -> int:
    """Bytes one copy of a layer keeps per micro-batch on one device."""
    return sum(saved_bytes(s, sizes) for s in kept_saves(gf, rc).values())


def recompute_working_bytes(gf: GraphFacts, rc: Recompute | None, sizes: dict[str, int]) -> int:
    """The most bytes the backward of one copy of a layer, for one micro-batch, holds
    re-materialised beyond what the copy keeps (`kept_saves`) and has not yet freed.

    The layer's backward runs its ops' backward in reverse order; a kept tensor lives
    until the backward of its last reader. A tensor recompute dropped (one the layer
    saves without recompute but does not keep) is made again when a backward first
    reads it, by rerunning its producer, which makes everything it saves at once;
    the producer's inputs must then exist, and are rerun in turn if they are not
    kept. MindSpore starts a recomputed op only when the backward part that reads it
    begins (its recompute pass ties the copy to that backward: the "Recomputation"
    design note of the MindSpore docs). A re-made tensor lives until the backward of
    its last reader. The result is the largest, over the backward steps, of the
    re-made bytes alive less the kept bytes already freed, at least 0.

    `full`: the layer's last op that saves anything needs its saved tensors, whose
    making reruns the chain from the kept input, so at that first step every tensor
    the layer saves without recompute exists again and nothing is freed yet: the
    layer's whole saved set less its input. That is what Megatron-LM's full
    recompute holds (the layer's forward rerun under autograd, then its backward);
    Korthikanti et al. 2022's 2sbhL for full recompute counts only the kept inputs.
    `select(...)`: a named op reruns at the first backward reading what it dropped,
    and the later ops' kept tensors are freed by then. No recompute: 0.

    Gradient buffers and forward temporaries are counted in no mode (as everywhere in
    the estimate): this is the saved tensors' part of the working memory.
    """
    kept = kept_saves(gf, rc)
    dropped = {k: s for k, s in kept_saves(gf, None).items() if k not in kept}
    if not dropped:
        return 0
    maker = {name: name for name in gf.ops}  # an op's output tensor bears its name
    for name, of in gf.ops.items():
        maker |= {s.key: name for s in of.saves if s.role == "internal"}
    uses: dict[str, list[int]] = {}  # backward steps (op indices) each tensor is read at
    rerun: set[str] = set()

    def need(key: str, step: int) -> None:
        uses.setdefault(key, []).append(step)
        op = maker.get(key)  # None: the layer's input
        if key in kept or op is None or op in rerun:
            return
        rerun.add(op)
        made = [s.key for s in gf.ops[op].saves if s.role == "internal"] + [op]
        for k in made:
            if k in dropped and k != key:
                uses.setdefault(k, []).append(step)
        for ref in gf.ops[op].node.inputs:
            need(ref.name, step)

    names = list(gf.ops)
    for step in reversed(range(len(names))):
        for s in gf.ops[names[step]].saves:
            need(s.key, step)
    peak = 0
    for step in range(len(names)):
        alive = sum(
            saved_bytes(s, sizes)
            for k, s in dropped.items()
            if k in uses and min(uses[k]) <= step <= max(uses[k])
        )
        freed = sum(
            saved_bytes(s, sizes) for k, s in kept.items() if k in uses and min(uses[k]) > step
        )
        peak = max(peak, alive - freed)
    return peak


def network_saves(plan: Plan, sizes: dict[str, int]) -> tuple[list[int], list[int], list[int]]:
    """Per stage, bytes per micro-batch that the network's own ops save: (others, the
    loss op's, those freed before any repeated layer's backward). The loss op's (the
    fp32 logits) are the logits row. Freed: read only by ops after the last repeat,
    whose backward runs before the layers' (the final norm's and output layer's
    inputs, the loss's). Multi-token prediction's modules are on the last stage: each
    keeps what its ops and its block copy keep (others) and its own fp32 logits (the
    logits row), all freed before the repeated layers' backward."""
    gf = plan.graph("network")
    loss = gf.graph.output
    names = list(gf.ops)
    last = max((i for i, n in enumerate(names) if gf.ops[n].node.kind == "repeat"), default=-1)
    others, logits, freed = [0] * plan.stages, [0] * plan.stages, [0] * plan.stages
    seen: dict[tuple[int, str], int] = {}
    early: set[tuple[int, str]] = set()  # read by an op up to the last repeat
    ops = sorted(gf.ops.items(), key=lambda item: item[0] != loss)  # the loss op first
    for name, of in ops:
        if of.node.kind == "repeat":
            continue
        stage = plan.network_op_stage(of.node)
        row = logits if name == loss else others
        for s in of.saves:
            if (stage, s.key) not in seen:
                seen[stage, s.key] = saved_bytes(s, sizes)
                row[stage] += seen[stage, s.key]
            if names.index(name) <= last:
                early.add((stage, s.key))
    for (stage, key), n in seen.items():
        if (stage, key) not in early:
            freed[stage] += n
    if plan.mtp is not None:
        mod, last = plan.mtp, plan.stages - 1
        own, loss = mod.saves()
        block = layer_activation_bytes(
            plan.graph(mod.setting.layer), plan.spec.recompute.get(mod.setting.layer), sizes
        )
        kept = mod.setting.depth * (sum(saved_bytes(s, sizes) for s in own) + block)
        fp32 = mod.setting.depth * sum(saved_bytes(s, sizes) for s in loss)
        others[last] += kept
        logits[last] += fp32
        freed[last] += kept + fp32  # the modules' backward runs before the layers'
    return others, logits, freed
