"""Names: tensors defined once and before use, layers and ops that exist, nothing unused."""

from __future__ import annotations

from msgen.analysis.facts import Facts
from msgen.checks.reserved import camel, class_clash, reserved_reason
from msgen.diagnostics import Diagnostic, did_you_mean, error, warning
from msgen.ir.models import Graph, Spec
from msgen.ops import OPS


def check_graph(graph: Graph, spec: Spec, is_network: bool) -> list[Diagnostic]:
    diags: list[Diagnostic] = []
    defined: dict[str, int] = {}
    if graph.input is not None:
        defined[graph.input.name] = graph.input.span.line
    later = {op.name: op for op in graph.ops}
    used: set[str] = set()
    for op in graph.ops:
        for ref in op.inputs:
            used.add(ref.name)
            if ref.name in defined:
                continue
            if ref.name in later:
                diags.append(
                    error(
                        "MSL111",
                        f"`{ref.name}` is used before it is defined (line "
                        f"{later[ref.name].span.line})",
                        ref.span,
                        "statements run top to bottom; move the definition up",
                    )
                )
            else:
                diags.append(
                    error(
                        "MSL110",
                        f"unknown tensor `{ref.name}`",
                        ref.span,
                        did_you_mean(ref.name, defined) or f"defined here: {', '.join(defined)}",
                    )
                )
        opdef = OPS.get(op.kind)
        for arg, other in (opdef.shared_from(op.args) if opdef else {}).items():
            used.add(other)
            if other not in defined:
                diags.append(
                    error(
                        "MSL110",
                        f"`{arg} = {other}` names no op defined above",
                        op.arg_spans.get(arg, op.span),
                        did_you_mean(other, defined),
                    )
                )
        if op.kind == "repeat":
            layer = op.args["layer"]
            if not is_network:
                diags.append(
                    error("MSL116", "`repeat` belongs in the network, not in a layer", op.span)
                )
            elif layer not in spec.layers:
                diags.append(
                    error(
                        "MSL114",
                        f"unknown layer `{layer}`",
                        op.arg_spans["layer"],
                        did_you_mean(layer, spec.layers)
                        or (f"layers: {', '.join(spec.layers)}" if spec.layers else "no layers"),
                    )
                )
        if op.name in defined and op.name != "output":
            diags.append(
                error(
                    "MSL102",
                    f"`{op.name}` is defined twice",
                    op.span,
                    f"first defined on line {defined[op.name]}",
                )
            )
        defined.setdefault(op.name, op.span.line)
    if graph.output and graph.output not in defined:
        diags.append(
            error(
                "MSL110",
                f"unknown tensor `{graph.output}`",
                graph.output_span,
                did_you_mean(graph.output, defined),
            )
        )
    used.add(graph.output or "")
    if any(d.code in ("MSL110", "MSL111") for d in diags):
        return diags  # a misspelt or misplaced use: "never used" would only echo it
    for op in graph.ops:
        if op.name not in used:
            diags.append(
                warning(
                    "MSL112",
                    f"`{op.name}` is computed but never used",
                    op.span,
                    "use it, or delete the statement",
                )
            )
    return diags


def reserved(spec: Spec) -> list[Diagnostic]:
    """Names the generated code cannot carry (see msgen/checks/reserved.py)."""
    diags = []
    hint = "rename it; the generated cells use this name for something else"
    for graph in [*spec.layers.values(), spec.network]:
        named = [(graph.input.name, graph.input.span)] if graph.input else []
        named += [(op.name, op.span) for op in graph.ops if op.name != "output"]
        for name, span in named:
            why = reserved_reason(name)
            if why is None and graph is spec.network and name in spec.layers:
                why = "the network keeps the copies of the layer by that name"
            if why:
                diags.append(error("MSL125", f"`{name}` cannot name a tensor: {why}", span, hint))
    classes = {camel(spec.model.name): spec.model.name}
    for name, graph in spec.layers.items():
        why = class_clash(name)
        if why is None and camel(name) in classes:
            why = f"its class `{camel(name)}` is also the class of `{classes[camel(name)]}`"
        if why:
            diags.append(error("MSL125", f"`{name}` cannot name a layer: {why}", graph.span, hint))
        classes.setdefault(camel(name), name)
    why = class_clash(spec.model.name)
    if why:
        span = spec.model.span
        diags.append(error("MSL125", f"`{spec.model.name}` cannot name the model: {why}", span))
    return diags


def run(spec: Spec, facts: Facts) -> list[Diagnostic]:
    """After msgen.analysis.graph.order: it knows which layers are repeated."""
    diags: list[Diagnostic] = reserved(spec)
    for graph in spec.layers.values():
        diags += check_graph(graph, spec, is_network=False)
    diags += check_graph(spec.network, spec, is_network=True)
    unknown_repeat = any(
        op.kind == "repeat" and op.args["layer"] not in spec.layers for op in spec.network.ops
    )
    for name, graph in spec.layers.items():
        if name not in facts.repeats and not unknown_repeat:
            diags.append(
                warning(
                    "MSL124",
                    f"layer `{name}` is never repeated",
                    graph.span,
                    f"use it in the network: `repeat {name}(x) N`",
                )
            )
    for rc in spec.recompute.values():
        if rc.layer not in spec.layers:
            diags.append(
                error(
                    "MSL114",
                    f"recompute names unknown layer `{rc.layer}`",
                    rc.span,
                    did_you_mean(rc.layer, spec.layers),
                )
            )
            continue
        ops = {op.name for op in spec.layers[rc.layer].ops}
        for ref in rc.ops:
            if ref.name not in ops:
                diags.append(
                    error(
                        "MSL110",
                        f"layer `{rc.layer}` has no op `{ref.name}`",
                        ref.span,
                        did_you_mean(ref.name, ops),
                    )
                )
    return diags
