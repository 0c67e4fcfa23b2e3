"""Lowering of `layer` and `network` blocks: op statements resolved against the
op library's signatures, shard annotations, repeats."""

from __future__ import annotations

from msgen.diagnostics import Span, did_you_mean
from msgen.ir import models as ir
from msgen.ir.schema import (
    REQUIRED,
)
from msgen.lowering.evaluate import Evaluator
from msgen.lowering.reader import Reader
from msgen.ops import OPERATORS, OPS
from msgen.syntax import ast


class GraphLowering(Reader):
    """Layer and network blocks to op graphs."""

    def sharding(self, lst: ast.List) -> ir.Sharding | None:
        dims, spans = [], []
        for item in lst.items:
            axes = self.axes(item)
            if axes is None:
                self.err(
                    "MSL210",
                    "a split entry is a mesh axis, a product of axes, or 1",
                    item.span,
                    "e.g. `@ [dp, 1, tp]` or `@ [dp*tp, 1]`",
                )
                return None
            dims.append(axes)
            spans.append(item.span)
        return ir.Sharding.model_construct(
            span=lst.span, dims=tuple(dims), entry_spans=tuple(spans)
        )

    def axes(self, expr) -> tuple[str, ...] | None:
        match expr:
            case ast.Number(value=1):
                return ()
            case ast.Name(name=n):
                return (n,)
            case ast.BinOp(op="*", left=a, right=b):
                left, right = self.axes(a), self.axes(b)
                return None if left is None or right is None else left + right
        return None

    def lower_graph(self, block: ast.Block, env: dict[str, int], name: str) -> ir.Graph:
        ev = Evaluator(env, self.diags, failed=self.failed_dims)
        decl: ir.TensorDecl | None = None
        ops: list[ir.OpNode] = []
        output: str | None = None
        output_span: Span | None = None
        tensors: set[str] = set()
        for stmt in block.stmts:
            if isinstance(stmt, ast.InputDecl):
                if decl is not None:
                    self.err(
                        "MSL120",
                        f"`{name}` has a second input",
                        stmt.span,
                        "a layer or network takes exactly one input",
                    )
                    continue
                dims = [ev.dim(d, "a shape dim") for d in stmt.shape.items]
                out_sharding = self.annots(stmt.annots, None)[0]
                decl = ir.TensorDecl.model_construct(
                    span=stmt.span,
                    name=stmt.name.name,
                    shape=tuple(d or 1 for d in dims),
                    sharding=out_sharding,
                )
                tensors.add(stmt.name.name)
            elif isinstance(stmt, ast.Assign):
                if output is not None:
                    self.err("MSL120", "statements after `output` are never run", stmt.span)
                node = self.op(
                    stmt.target.name,
                    stmt.target.span,
                    stmt.span,
                    stmt.value,
                    stmt.annots,
                    ev,
                    tensors,
                )
                if node is not None:
                    ops.append(node)
                tensors.add(stmt.target.name)
            elif isinstance(stmt, ast.OutputStmt):
                if output is not None:
                    self.err("MSL120", f"`{name}` has a second output", stmt.span)
                    continue
                if isinstance(stmt.value, ast.Name) and not stmt.annots:
                    output = stmt.value.name
                    output_span = stmt.value.span
                    continue
                node = self.op("output", stmt.span, stmt.span, stmt.value, stmt.annots, ev, tensors)
                if node is not None:
                    ops.append(node)
                output, output_span = "output", stmt.span
            else:
                self.err(
                    "MSL104",
                    f"this statement does not belong in a `{block.kind.name}` " "block",
                    stmt.span,
                )
        if decl is None:
            self.err(
                "MSL120",
                f"`{name}` has no `input`",
                block.kind.span,
                "add `input x : [batch, seq, hidden] @ [dp, 1, 1]`",
            )
        if output is None:
            self.err(
                "MSL120",
                f"`{name}` has no `output`",
                block.kind.span,
                "end it with `output <tensor or expression>`",
            )
        return ir.Graph.model_construct(
            span=block.span,
            name=name,
            input=decl,
            ops=tuple(ops),
            output=output,
            output_span=output_span,
        )

    def annots(self, annots, op) -> tuple[ir.Sharding | None, dict[str, ir.Sharding]]:
        out, params = None, {}
        for annot in annots:
            sharding = self.sharding(annot.split)
            if annot.param is None:
                if out is not None:
                    self.err("MSL102", "the output split is given twice", annot.span)
                out = sharding
                continue
            pname = annot.param.name
            if op is None or pname not in op.params:
                owner = f"`{op.name}`" if op else "an input"
                known = op.params if op else ()
                hint = did_you_mean(pname, known) or (
                    f"{owner} has parameters: {', '.join(known)}"
                    if known
                    else f"{owner} has no parameters"
                )
                self.err("MSL209", f"{owner} has no parameter `{pname}`", annot.param.span, hint)
                continue
            if sharding is not None:
                params[pname] = sharding
        return out, params

    def op(self, name, name_span, span, value, annots, ev, tensors) -> ir.OpNode | None:
        if isinstance(value, ast.Repeat):
            return self.repeat(name, span, value, annots, ev)
        if isinstance(value, ast.BinOp) and value.op in OPERATORS:
            return self.binop(name, span, value, annots, ev, tensors)
        if isinstance(value, ast.BinOp):
            self.err(
                "MSL116",
                f"`{value.op}` does not apply to tensors",
                value.span,
                "tensors combine with `+` and `*`; other arithmetic is for dims",
            )
            return None
        if not isinstance(value, ast.Call):
            self.err("MSL116", "a statement here applies an op: `name = op(args)`", value.span)
            return None
        kind = value.func.name
        opdef = OPS.get(kind)
        if opdef is None or kind in OPERATORS.values():
            from msgen.ops import CALLABLE

            self.err(
                "MSL113",
                f"unknown op `{kind}`",
                value.func.span,
                did_you_mean(kind, CALLABLE) or f"ops: {', '.join(CALLABLE)}",
            )
            return None
        bound: dict[str, ast.Expr] = {}
        spans: dict[str, Span] = {}
        if len(value.args) > len(opdef.args):
            self.err(
                "MSL115",
                f"{kind} takes at most {len(opdef.args)} arguments, got " f"{len(value.args)}",
                value.args[len(opdef.args)].span,
                f"{kind}({', '.join(a.name for a in opdef.args)})",
            )
            return None
        for arg, expr in zip(opdef.args, value.args, strict=False):
            bound[arg.name] = expr
        names = [a.name for a in opdef.args]
        for kw in value.kwargs:
            key = kw.name.name
            if key not in names:
                self.err(
                    "MSL115",
                    f"{kind} has no argument `{key}`",
                    kw.name.span,
                    did_you_mean(key, names) or f"{kind}({', '.join(names)})",
                )
                return None
            if key in bound:
                self.err("MSL115", f"`{key}` is given twice", kw.name.span)
                return None
            bound[key] = kw.value
        inputs, args = [], {}
        for arg in opdef.args:
            expr = bound.get(arg.name)
            if expr is None:
                if arg.default is REQUIRED:
                    self.err(
                        "MSL115",
                        f"{kind} needs `{arg.name}`",
                        value.span,
                        f"{kind}({', '.join(names)})",
                    )
                    return None
                continue
            spans[arg.name] = expr.span
            if arg.kind == "tensor":
                if not isinstance(expr, ast.Name):
                    self.err(
                        "MSL116",
                        f"`{arg.name}` of {kind} must name a tensor",
                        expr.span,
                        "write the inner expression on its own line and use its name",
                    )
                    return None
                inputs.append(ir.TensorRef.model_construct(span=expr.span, name=expr.name))
            elif arg.kind == "op":
                if not isinstance(expr, ast.Name):
                    self.err("MSL116", f"`{arg.name}` must name an op", expr.span)
                    return None
                args[arg.name] = expr.name
            elif arg.kind == "name":
                if not (isinstance(expr, ast.Name) and expr.name in arg.choices):
                    self.err(
                        "MSL116",
                        f"`{arg.name}` of {kind} is one of {', '.join(arg.choices)}",
                        expr.span,
                    )
                    return None
                args[arg.name] = expr.name
            elif arg.kind == "call":
                form = self.call(expr, f"`{arg.name}` of {kind}", ev)
                if form is None:
                    return None
                args[arg.name] = form
            elif arg.kind == "bool":
                if not (isinstance(expr, ast.Name) and expr.name in ("true", "false")):
                    self.err("MSL116", f"`{arg.name}` of {kind} is `true` or `false`", expr.span)
                    return None
                args[arg.name] = expr.name == "true"
            elif arg.kind == "int":
                v = ev.dim(expr, arg.name)
                if v is None:
                    return None
                args[arg.name] = v
            else:
                v = ev.number(expr)
                if v is None:
                    return None
                if arg.within and not arg.allows(v):
                    self.err(
                        "MSL126",
                        f"`{arg.name}` of {kind} is {v}, out of range",
                        expr.span,
                        f"`{arg.name}` is in {arg.within}",
                    )
                    return None
                args[arg.name] = float(v)
        out, params = self.annots(annots, opdef)
        shared = opdef.shared_from(args)
        if shared and params:
            (arg, other), *_ = shared.items()
            self.err(
                "MSL209",
                f"`{name}` is tied to `{other}` and owns no parameters",
                next(iter(params.values())).span,
                f"split the parameters where `{other}` defines them (`{arg} = {other}`)",
            )
            return None
        return _op_node(span, name, kind, inputs, args, spans, out, params)

    def binop(self, name, span, value, annots, ev, tensors) -> ir.OpNode | None:
        inputs, args, spans = [], {}, {}
        for side in (value.left, value.right):
            if isinstance(side, ast.Name) and (side.name in tensors or side.name not in ev.env):
                inputs.append(ir.TensorRef.model_construct(span=side.span, name=side.name))
                spans["ab"[len(inputs) - 1]] = side.span
            elif isinstance(side, ast.Name | ast.Number | ast.BinOp | ast.Neg):
                if "const" in args:
                    self.err("MSL116", "at least one operand must be a tensor", value.span)
                    return None
                v = ev.number(side)
                if v is None:
                    return None
                args["const"] = v
            else:
                self.err(
                    "MSL116",
                    "operands of `+` and `*` are tensor names or numbers",
                    side.span,
                    "write the inner op on its own line and use its name",
                )
                return None
        kind = OPERATORS[value.op]
        return _op_node(span, name, kind, inputs, args, spans, *self.annots(annots, OPS[kind]))

    def repeat(self, name, span, value: ast.Repeat, annots, ev) -> ir.OpNode | None:
        if len(value.args) != 1 or value.kwargs or not isinstance(value.args[0], ast.Name):
            self.err("MSL116", "repeat passes one tensor: `repeat LAYER(x) COUNT`", value.span)
            return None
        count = ev.dim(value.count, "the repeat count")
        if count is None:
            return None
        if annots:
            self.err(
                "MSL209", "a repeat takes no split; the layer's input declares it", annots[0].span
            )
        x = value.args[0]
        return ir.OpNode.model_construct(
            span=span, name=name, kind="repeat", inputs=(ir.TensorRef.model_construct(span=x.span, name=x.name),),
            args={"layer": value.layer.name, "count": count},
            arg_spans={"layer": value.layer.span, "count": value.count.span},
        )  # fmt: skip


def _op_node(span, name, kind, inputs, args, arg_spans, out, params) -> ir.OpNode:
    return ir.OpNode.model_construct(
        span=span,
        name=name,
        kind=kind,
        inputs=tuple(inputs),
        args=args,
        arg_spans=arg_spans,
        out_sharding=out,
        param_shardings=params,
    )
