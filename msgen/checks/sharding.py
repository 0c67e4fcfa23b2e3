"""Sharding: splits name real mesh axes once each (`declared`, before layouts are
derived), divide the dims they split, and agree between producer and consumer
(else an implicit redistribution, reported with its bytes per step). The layouts
themselves come from msgen.analysis.graph."""

from __future__ import annotations

from math import gcd

from msgen.analysis.facts import (
    Facts,
    GraphFacts,
    context,
    graph_of,
)
from msgen.diagnostics import Diagnostic, Span, did_you_mean, error, format_bytes, warning
from msgen.ir.models import Sharding, Spec
from msgen.ops import OPS
from msgen.ops.base import OpError, Param, split_factor

TENSOR_AXES = ("dp", "tp")
PARAM_AXES = TENSOR_AXES + ("ep",)  # ep (inside dp) splits parameters: the experts' dim


def check_sharding(
    s: Sharding, rank: int, what: str, axes_allowed: tuple[str, ...] = TENSOR_AXES
) -> list[Diagnostic]:
    diags = []
    if len(s.dims) != rank:
        return [
            error(
                "MSL202",
                f"{what} has {rank} dims but the split lists {len(s.dims)}",
                s.span,
                "give one entry per dim: a mesh axis, a product like dp*tp, or 1",
            )
        ]
    seen: set[str] = set()
    for axes, span in zip(s.dims, s.entry_spans, strict=True):
        for axis in axes:
            if axis == "pp":
                diags.append(
                    error(
                        "MSL205",
                        "`pp` cannot split a tensor",
                        span,
                        "pp splits the layers into pipeline stages; tensors split over dp or tp",
                    )
                )
            elif axis not in axes_allowed:
                diags.append(
                    error(
                        "MSL203",
                        f"unknown mesh axis `{axis}`",
                        span,
                        did_you_mean(axis, TENSOR_AXES) or "tensors split over `dp` and `tp`",
                    )
                )
            elif axis in seen:
                diags.append(
                    error(
                        "MSL204",
                        f"axis `{axis}` splits {what} twice",
                        span,
                        "each mesh axis may split one dim of a tensor",
                    )
                )
            seen.add(axis)
    return diags


def declared_ok(gf: GraphFacts, spec: Spec) -> list[Diagnostic]:
    """Check every split written in a graph against the shape it applies to."""
    graph = gf.graph
    diags = []
    if graph.input is not None and graph.input.sharding is not None:
        diags += check_sharding(graph.input.sharding, len(graph.input.shape), graph.input.name)
    ctx = context(spec)
    for node in graph.ops:
        if node.name not in gf.shapes:
            continue
        if node.out_sharding is not None:
            diags += check_sharding(node.out_sharding, len(gf.shapes[node.name]), node.name)
        if node.param_shardings:
            operands = [gf.shapes.get(r.name, ()) for r in node.inputs]
            try:
                pshapes = OPS[node.kind].param_shapes(node, operands, ctx)
            except OpError:
                pshapes = {}
            for pname, s in node.param_shardings.items():
                if pname in pshapes:
                    what = f"{node.name}.{pname}"
                    diags += check_sharding(s, len(pshapes[pname]), what, PARAM_AXES)
                    diags += ep_placed(s, node.kind, node.name, pname)
    return diags


def ep_placed(s: Sharding, kind: str, op: str, pname: str) -> list[Diagnostic]:
    """ep splits the first dim (the experts') of an op's expert parameters and nothing
    else: the generated code splits only that dim over ep (msgen/ops/moe.py
    `strategies`), and another place would make the estimate and the strategy file
    describe slices the ranks do not hold."""
    expert = pname in OPS[kind].expert_params
    diags = []
    for dim, (axes, span) in enumerate(zip(s.dims, s.entry_spans, strict=True)):
        if "ep" not in axes or (expert and dim == 0):
            continue
        if expert:
            message = f"is split over `ep` on dim {dim}: ep splits only the experts' dim, the first"
            hint = f"write `ep` first: `{pname} @ [ep, ...]`"
        else:
            message = "cannot be split over `ep`: ep splits only the experts of a moe op"
            hint = "split it over dp or tp"
        diags.append(error("MSL210", f"`{pname}` of {kind} `{op}` {message}", span, hint))
    return diags


class _Divisibility:
    """Collects the first dim each mesh axis fails to divide, one report per axis."""

    def __init__(self, spec: Spec, ctx):
        self.spec = spec
        self.ctx = ctx
        self.first: dict[tuple[str, ...], tuple[str, int, Span]] = {}

    def check(self, what: str, shape, split, span: Span):
        for n, axes in zip(shape, split, strict=False):
            f = split_factor(axes, self.ctx)
            if axes and n % f:
                self.first.setdefault(tuple(axes), (what, n, span))

    def diagnostics(self) -> list[Diagnostic]:
        mesh, dims = self.spec.mesh, self.spec.model.dims
        out = []
        for axes, (what, n, span) in self.first.items():
            f = split_factor(axes, self.ctx)
            named = next((k for k, v in dims.items() if v == n and k in what), None) or next(
                (k for k, v in dims.items() if v == n), None
            )
            subject = f"{named} = {n}" if named else f"{n} ({what})"
            if len(axes) == 1 and axes[0] in mesh.spans:
                axis = axes[0]
                hint = self.suggest(axis)
                out.append(
                    error(
                        "MSL201",
                        f"{axis} = {f} does not divide {subject}",
                        mesh.spans[axis],
                        hint,
                    )
                )
            else:
                out.append(
                    error(
                        "MSL201",
                        f"{'*'.join(axes)} = {f} does not divide {subject}",
                        span,
                        "split over axes whose product divides the dim",
                    )
                )
        return out

    def suggest(self, axis: str) -> str:
        mesh = self.spec.mesh
        cluster = self.spec.cluster
        devices = cluster.per_node * len(cluster.nodes) or mesh.devices
        watched = [k for k in ("heads", "kv_heads", "hidden", "ffn", "vocab")
                   if k in self.spec.model.dims]  # fmt: skip
        dims = [self.spec.model.dims[k] for k in watched]
        others = devices // max(1, mesh.pp)
        # candidates divide the devices and every watched dim: their gcd, whose
        # divisors are few (never count up to a device count near 2^40); none when
        # pp alone is more than the devices (gcd(0, ...) would be the dims')
        g = gcd(others, *dims) if others else 1
        good = [t for t in range(2, min(g, 4096) + 1) if g % t == 0]
        names = ", ".join(f"{k} ({self.spec.model.dims[k]})" for k in watched)
        tries = [self.meshing(axis, t, others) for t in good]
        tries = [t for t in tries if t][:3] or [f"{axis} = 1"]
        return (
            f"{axis} must divide {names}, and dp * tp * pp must equal the {devices} devices: "
            f"try {', or '.join(tries)}"
        )

    def meshing(self, axis: str, size: int, others: int) -> str | None:
        """A mesh with `axis` = size that still covers the devices and the batch,
        written as the changes it needs; None when there is none."""
        if axis not in ("dp", "tp") or others % size:
            return f"{axis} = {size}" if axis not in ("dp", "tp") else None
        other = "tp" if axis == "dp" else "dp"
        rest = others // size
        if axis == "tp" and size > max(1, self.spec.cluster.per_node):
            return None
        if rest == self.spec.mesh.size(other):
            return f"{axis} = {size}"
        dp = rest if other == "dp" else size
        train = self.spec.train
        per_step = train.micro_batch * dp
        if train.global_batch % per_step:
            return None
        change = (
            f"{other} = {rest}, {axis} = {size}"
            if other == "dp"
            else f"{axis} = {size}, {other} = {rest}"
        )
        return f"{change} with micro_batches = {train.global_batch // per_step}"


def declared(spec: Spec, facts: Facts) -> list[Diagnostic]:
    """Every written split names real mesh axes, once each, at the right rank."""
    diags: list[Diagnostic] = []
    for name in facts.order:
        gf = facts.graphs.get(name)
        if gf is not None:
            diags += declared_ok(gf, spec)
    return diags


def run(spec: Spec, facts: Facts) -> list[Diagnostic]:
    """Over the layouts msgen.analysis.graph found: every split divides its dim,
    and redistributions are reported with their bytes per step."""
    ctx = context(spec)
    divisibility = _Divisibility(spec, ctx)
    for name in facts.order:
        gf = facts.graphs[name]
        graph = graph_of(spec, name)
        tied: dict[str, Param] = {}
        op_ctx = context(spec, tied)
        if graph.input is not None and graph.input.name in gf.tensors:
            decl = graph.input
            divisibility.check(decl.name, decl.shape, gf.tensors[decl.name].split, decl.span)
        for of in gf.ops.values():
            node = of.node
            if of.output is None:
                continue
            if of.layout is not None:
                for p in of.layout.params:
                    span = node.param_shardings.get(p.name, node).span
                    divisibility.check(f"{node.name}.{p.name}", p.shape, p.split, span)
                    if OPS[node.kind].tieable:
                        tied[node.name] = p
                for what, n, axes in OPS[node.kind].divisible(node, of.layout, op_ctx):
                    divisibility.check(what, (n,), (axes,), node.span)
            divisibility.check(node.name, of.output.shape, of.output.split, node.span)
    return divisibility.diagnostics() + redistribution_warnings(spec, facts)


def redistribution_warnings(spec: Spec, facts: Facts) -> list[Diagnostic]:
    out = []
    steps = spec.micro_batches * 2  # forward, and its mirror in backward
    for name in facts.order:
        copies = facts.repeats[name].args["count"] if name in facts.repeats else 1
        for of in facts.graphs[name].ops.values():
            for r in of.redistributions:
                per_step = r.bytes_per_device * steps * copies * r.times
                out.append(
                    warning(
                        "MSL208",
                        f"`{r.operand}` is split {fmt_split(r.produced)} but `{r.op}` needs "
                        f"{fmt_split(r.needed)}: an implicit redistribution moves "
                        f"{format_bytes(per_step)} per device per step",
                        r.span,
                        f"split `{r.operand}` as {fmt_split(r.needed)} where it is produced, "
                        "if that is what you meant",
                    )
                )
    return out


def fmt_split(split) -> str:
    return "[" + ", ".join("*".join(a) or "1" for a in split) + "]"
