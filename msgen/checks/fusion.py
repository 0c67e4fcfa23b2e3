"""The fusion groups' checks, among the training settings' (msgen/checks/train.py runs
them): buckets no more than the layers, patterns that match no parameter, and what an
`allgather` or `reducescatter` group does.
"""

from __future__ import annotations

import fnmatch

from msgen.analysis.facts import Facts
from msgen.analysis.globs import matches_some
from msgen.diagnostics import Diagnostic, error, warning
from msgen.ir.models import Spec
from msgen.ir.schema import FusionKind


def check_buckets(spec: Spec) -> list[Diagnostic]:
    layers = spec.network.total_layers
    diags = []
    for group in spec.fusion:
        if group.buckets > 1 and group.buckets > layers:
            diags.append(
                error(
                    "MSL511",
                    f"group `{group.name}` asks for {group.buckets} buckets, but the network "
                    f"repeats {layers} {'layer' if layers == 1 else 'layers'}",
                    group.buckets_span or group.span,
                    "each bucket takes a contiguous range of at least one layer: use "
                    f"buckets {max(1, layers)} or fewer",
                )
            )
    return diags


# What a group's kind means. MindSpore keeps one comm fusion id per parameter
# (`Parameter.comm_fusion`, which the generated model sets to the group's id), and
# every collective it inserts for that parameter carries it: the gradient AllReduce,
# and under the parallel optimizer (zero >= 1) the AllGather of the weight and the
# ReduceScatter of its gradient. Collectives with the same id are fused. So a group
# fuses all of its parameters' collectives whatever its kind; its AutoParallel
# `comm_fusion` config cannot help either (it fuses by size, ignoring the ids). The
# ids are emitted for every kind, and a non-allreduce group gets a warning saying so.
KIND_OPS = {FusionKind.ALLGATHER: "AllGather", FusionKind.REDUCESCATTER: "ReduceScatter"}


def check_fusion_kinds(spec: Spec) -> list[Diagnostic]:
    zero = spec.train.zero
    diags = []
    for group in spec.fusion:
        if group.kind not in KIND_OPS:
            continue
        op = KIND_OPS[group.kind]
        if zero == 0:
            message = (
                f"fusion group `{group.name}` is `{group.kind}`, but with zero = 0 there "
                f"is no parallel optimizer and no {op} of its parameters to fuse: its ids "
                "fuse their gradient AllReduce, as an `allreduce` group's would"
            )
            hint = (
                f"write `allreduce {group.name} = ...`, or set train.zero >= 1 for the "
                "parallel optimizer's AllGather and ReduceScatter"
            )
        else:
            message = (
                f"fusion group `{group.name}` is `{group.kind}`, but a fusion id is per "
                "parameter: its ids fuse every collective of its parameters, the "
                f"optimizer's AllGather and ReduceScatter (zero = {zero}) and any gradient "
                f"AllReduce, not only the {op}"
            )
            hint = (
                "MindSpore keeps one fusion id per parameter, whatever the group's kind; "
                f"write `allreduce {group.name} = ...` to silence this"
            )
        diags.append(warning("MSL507", message, group.span, hint))
    return diags


def parameter_paths(facts: Facts, spec: Spec):
    """(network paths, [(layer, count, ["op.param", ...])]) from the sharding pass's
    layouts, or None when the facts are incomplete (an earlier pass failed)."""
    network: list[str] = []
    layers: list[tuple[str, int, list[str]]] = []
    if "network" not in facts.order:
        return None
    for name in facts.order:
        gf = facts.graphs.get(name)
        if gf is None:
            return None
        suffixes = []
        for node in gf.graph.ops:
            of = gf.ops.get(node.name)
            if node.kind == "repeat":
                continue
            if of is None or of.layout is None:
                return None
            suffixes += [f"{node.name}.{p.name}" for p in of.params]
        if name == "network":
            network = suffixes
        else:
            repeat = facts.repeats.get(name)
            if repeat is None:
                return None
            layers.append((name, repeat.args["count"], suffixes))
    return network, layers


def matches_any(pattern: str, paths) -> bool:
    """Whether the glob matches some parameter path: every copy's, exactly, as the
    plan assigns fusion ids (msgen.analysis.globs), never a sample of them."""
    network, layers = paths
    if any(fnmatch.fnmatchcase(p, pattern) for p in network):
        return True
    return any(
        matches_some(pattern, f"{layer}.", f".{s}", count)
        for layer, count, suffixes in layers
        for s in suffixes
    )


def check_patterns(spec: Spec, facts: Facts) -> list[Diagnostic]:
    if not spec.fusion:
        return []
    paths = parameter_paths(facts, spec)
    if paths is None:
        return []
    network, layers = paths
    examples = [f"{layer}.0.{s}" for layer, _, suffixes in layers for s in suffixes[:1]]
    examples += network[:1]
    diags = []
    for group in spec.fusion:
        for i, pattern in enumerate(group.patterns):
            if matches_any(pattern, paths):
                continue
            span = group.pattern_spans[i] if i < len(group.pattern_spans) else group.span
            hint = "patterns are fnmatch globs over parameter paths"
            if examples:
                hint += " such as " + ", ".join(f"`{e}`" for e in examples)
            diags.append(
                warning(
                    "MSL507",
                    f'pattern "{pattern}" of fusion group `{group.name}` matches no parameter',
                    span,
                    hint,
                )
            )
    return diags
