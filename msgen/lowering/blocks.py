"""Lowering of the key-value blocks: model dims, mesh, train, pipeline, budget,
recompute and fusion."""

from __future__ import annotations

import re
from collections import Counter

from msgen.diagnostics import Span, did_you_mean, warning
from msgen.ir import models as ir
from msgen.ir.schema import (
    EVAL_EVERY,
    MODEL_KEYS,
    MODEL_REQUIRED,
    Dtype,
    FusionKind,
    LossScale,
    RecomputeMode,
    Schedule,
)
from msgen.lowering.evaluate import UNIT_BYTES, DefinedAfter, Evaluator
from msgen.lowering.reader import DTYPES, Reader, names_in
from msgen.syntax import ast


class BlockLowering(Reader):
    """The key-value blocks, each to its IR model."""

    def lower_model(self, block: ast.Block) -> ir.Model:
        dims: dict[str, int] = {}
        spans: dict[str, Span] = {}
        dtype = param_dtype = Dtype.FP32
        assigns = [s for s in block.stmts if isinstance(s, ast.Assign)]
        later = DefinedAfter({s.target.name: i for i, s in enumerate(assigns)})
        ev = Evaluator(dims, self.diags, later, self.failed_dims)
        for stmt in block.stmts:
            if not isinstance(stmt, ast.Assign):
                self.err("MSL104", "this statement does not belong in a `model` block", stmt.span)
        for i, stmt in enumerate(assigns):
            key = stmt.target.name
            if key in spans:
                self.err(
                    "MSL102",
                    f"`{key}` is defined twice",
                    stmt.target.span,
                    f"first defined on line {spans[key].line}",
                )
                continue
            spans[key] = stmt.span
            if key in ("dtype", "param_dtype"):
                value = self.name_value(stmt, DTYPES)
                if value and key == "dtype":
                    dtype = Dtype(value)
                elif value:
                    param_dtype = Dtype(value)
                continue
            if key == "batch":
                self.err(
                    "MSL102",
                    "`batch` is built in (= train.micro_batch * dp)",
                    stmt.target.span,
                    "pick another name",
                )
                continue
            later.index = i
            value = ev.dim(stmt.value, key)
            if value is not None:
                dims[key] = value
            else:
                self.failed_dims.add(key)
        self.lookalike_dims(assigns)
        for key in MODEL_REQUIRED:
            if key not in spans:
                self.failed_dims.add(key)  # reported here, not again at each use
                self.err(
                    "MSL105",
                    f"`model` needs `{key}`",
                    block.kind.span,
                    f"add `{key} = ...` to the model block",
                )
        return ir.Model.model_construct(
            span=block.span,
            spans=spans,
            name=block.name.name,
            dims=dims,
            dtype=dtype,
            param_dtype=param_dtype,
        )

    def lookalike_dims(self, assigns: list[ast.Assign]) -> None:
        """MSL127: a free dim nothing uses whose name is close to a key msgen reads
        (`kv_head = 8` meant as `kv_heads`) is most likely a typo."""
        close = {}
        for stmt in assigns:
            key = stmt.target.name
            if key not in MODEL_KEYS and (hint := did_you_mean(key, MODEL_KEYS)):
                close[key] = (stmt, hint)
        if not close:
            return
        mentions = Counter(names_in(self.module))
        for key, (stmt, hint) in close.items():
            if mentions[key] == 1:  # its own definition only
                self.diags.append(
                    warning("MSL127", f"the dim `{key}` is never used", stmt.target.span, hint)
                )

    def lower_mesh(self, block: ast.Block) -> ir.Mesh:
        stmts = self.keyed(block, "mesh")
        ev = Evaluator({}, self.diags)
        sizes = {}
        for key, stmt in stmts.items():
            v = ev.dim(stmt.value, key)
            if v is not None:
                sizes[key] = v
        return ir.Mesh.model_construct(span=block.span, spans=self.spans_of(stmts), **sizes)

    def lower_train(self, block: ast.Block, ev: Evaluator) -> ir.Train:
        stmts = self.keyed(block, "train")
        values: dict = {}
        for key, stmt in stmts.items():
            v = stmt.value
            if key in ("micro_batch", "global_batch", "log_every"):
                values[key] = ev.dim(v, key)
            elif key in ("zero", "seed"):
                values[key] = ev.integer(v, key)
            elif key in ("optimizer", "schedule", "mtp"):
                values[key] = self.call(v, key, ev)
            elif key == "loss_scale":
                if isinstance(v, ast.Name):
                    values[key] = self.name_value(stmt, tuple(LossScale))
                else:
                    n = ev.number(v)
                    values[key] = None if n is None else str(n)
            elif key == "grad_clip":
                if isinstance(v, ast.Name) and v.name == "none":
                    values[key] = None
                else:
                    n = ev.number(v)
                    values[key] = None if n is None else float(n)
            elif key in ("master_weights", "grad_dtype"):
                values[key] = self.name_value(stmt, DTYPES + ("none",))
            elif key == "checkpoint":
                values[key] = self.checkpoint(v, ev)
            elif key == "data":
                values["data"], values["valid"] = self.data(v)
            elif key == "eval_every":
                values[key] = ev.dim(v, key)
            elif key == "scaled_init":
                flag = self.name_value(stmt, ("true", "false"))
                values[key] = None if flag is None else flag == "true"
        values = {k: v for k, v in values.items() if v is not None}
        if "valid" in values and "eval_every" not in stmts:
            values["eval_every"] = EVAL_EVERY
        for key in ("master_weights", "grad_dtype"):  # `none`: the default, no copy
            if key in values:
                if values[key] == "none":
                    del values[key]
                else:
                    values[key] = Dtype(values[key])
        return ir.Train.model_construct(span=block.span, spans=self.spans_of(stmts), **values)

    def checkpoint(self, expr, ev) -> ir.Checkpoint | None:
        if isinstance(expr, ast.Name) and expr.name == "none":
            return None
        if not isinstance(expr, ast.Every):
            self.err("MSL510", "checkpoint is written `every N keep M`", expr.span)
            return None
        every, keep = ev.dim(expr.every, "every"), ev.dim(expr.keep, "keep")
        if every is None or keep is None:
            return None
        return ir.Checkpoint.model_construct(span=expr.span, every=every, keep=keep)

    def data(self, expr) -> tuple[str | None, str | None]:
        """The train and validation MindRecord paths of `mindrecord("t", valid = "v")`."""
        if isinstance(expr, ast.Name) and expr.name == "none":
            return None, None
        if (
            isinstance(expr, ast.Call)
            and expr.func.name == "mindrecord"
            and len(expr.args) == 1
            and all(kw.name.name == "valid" for kw in expr.kwargs)
            and len(expr.kwargs) <= 1
        ):
            train = self.path_value(expr.args[0], "the mindrecord path")
            valid = None
            for kw in expr.kwargs:
                valid = self.path_value(kw.value, "the validation mindrecord path")
            return train, valid
        self.err(
            "MSL108",
            'data is written `mindrecord("path")` or `mindrecord("path", valid = "path")`',
            expr.span,
        )
        return None, None

    def lower_pipeline(self, block: ast.Block | None, ev: Evaluator) -> ir.Pipeline:
        if block is None:
            return ir.Pipeline.model_construct(
                span=Span(file=self.file, line=1, col=1, end_line=1, end_col=2)
            )
        stmts = self.keyed(block, "pipeline")
        values: dict = {}
        for key, stmt in stmts.items():
            v = stmt.value
            if key == "micro_batches":
                values[key] = ev.dim(v, key)
            elif key == "split":
                if isinstance(v, ast.List):
                    items = [ev.integer(i, "a stage's layers") for i in v.items]
                    values[key] = None if None in items else tuple(items)
                else:
                    self.err("MSL108", "split is a list of layers per stage: `[16, 16]`", v.span)
            elif key == "schedule":
                call = self.call(v, key, ev)
                if call is None:
                    continue
                if call.name not in tuple(Schedule) or (
                    call.name != Schedule.INTERLEAVED and call.args
                ):
                    self.err(
                        "MSL315",
                        f"unknown pipeline schedule `{call.name}`",
                        v.span,
                        "one of: 1f1b, gpipe, interleaved(chunks = N)",
                    )
                    continue
                values["schedule"] = Schedule(call.name)
                if call.name == Schedule.INTERLEAVED:
                    chunks = call.args.get("chunks")
                    if not isinstance(chunks, int) or chunks < 1 or set(call.args) != {"chunks"}:
                        self.err(
                            "MSL315",
                            "interleaved takes one argument, `chunks = N` " "(N >= 1)",
                            v.span,
                        )
                        continue
                    values["chunks"] = chunks
        values = {k: v for k, v in values.items() if v is not None}
        return ir.Pipeline.model_construct(span=block.span, spans=self.spans_of(stmts), **values)

    def lower_budget(self, block: ast.Block | None, ev: Evaluator) -> ir.Budget:
        if block is None:
            return ir.Budget.model_construct(
                span=Span(file=self.file, line=1, col=1, end_line=1, end_col=2)
            )
        stmts = self.keyed(block, "budget")
        values = {}
        if "device_memory" in stmts:
            v = stmts["device_memory"].value
            glued = isinstance(v, ast.Name) and re.fullmatch(r"([0-9]+)([A-Za-z]+)", v.name)
            if glued and glued[2] in UNIT_BYTES:
                # `64GB` lexes as one name (like `1f1b`): the unit is there, the space is not
                self.err(
                    "MSL108",
                    f"`{v.name}` needs a space between the number and the unit",
                    v.span,
                    f"write `{glued[1]} {glued[2]}`",
                )
            elif not isinstance(v, ast.Size):
                self.err("MSL108", "device_memory needs a unit, e.g. `58 GiB`", v.span)
            else:
                size = ev.integer(v, "device_memory")
                if size is not None and size > 0:
                    values["device_memory"] = size
        return ir.Budget.model_construct(span=block.span, spans=self.spans_of(stmts), **values)

    def lower_recompute(self, block: ast.Block | None) -> dict[str, ir.Recompute]:
        out: dict[str, ir.Recompute] = {}
        for stmt in block.stmts if block else ():
            if not isinstance(stmt, ast.Assign):
                self.err("MSL104", "recompute statements read `LAYER = full`", stmt.span)
                continue
            layer, v = stmt.target.name, stmt.value
            if layer in out:
                self.err("MSL102", f"recompute of `{layer}` is set twice", stmt.target.span)
                continue
            if isinstance(v, ast.Name) and v.name in (RecomputeMode.FULL, RecomputeMode.NONE):
                out[layer] = ir.Recompute.model_construct(
                    span=stmt.span, layer=layer, mode=RecomputeMode(v.name)
                )
            elif (
                isinstance(v, ast.Call)
                and v.func.name == "select"
                and v.args
                and not v.kwargs
                and all(isinstance(a, ast.Name) for a in v.args)
            ):
                ops = tuple(ir.TensorRef.model_construct(span=a.span, name=a.name) for a in v.args)
                out[layer] = ir.Recompute.model_construct(
                    span=stmt.span, layer=layer, mode=RecomputeMode.SELECT, ops=ops
                )
            else:
                self.err(
                    "MSL509",
                    "recompute is `full`, `none` or `select(op, ...)` naming at least one op",
                    v.span,
                )
        return out

    def lower_fusion(self, block: ast.Block | None, ev: Evaluator) -> tuple[ir.FusionGroup, ...]:
        groups: list[ir.FusionGroup] = []
        names: dict[str, Span] = {}
        for stmt in block.stmts if block else ():
            if not isinstance(stmt, ast.GroupDecl):
                self.err(
                    "MSL104", 'fusion groups read `allreduce NAME = ["pattern", ...]`', stmt.span
                )
                continue
            kind, name = stmt.kind.name, stmt.name.name
            if kind not in tuple(FusionKind):
                self.err(
                    "MSL104",
                    f"unknown fusion kind `{kind}`",
                    stmt.kind.span,
                    did_you_mean(kind, tuple(FusionKind))
                    or f"one of: {', '.join(tuple(FusionKind))}",
                )
                continue
            if name in names:
                self.err("MSL102", f"fusion group `{name}` is defined twice", stmt.name.span)
                continue
            names[name] = stmt.span
            if not isinstance(stmt.value, ast.List) or not stmt.value.items:
                self.err(
                    "MSL108",
                    'a fusion group is a list of patterns: `["decoder.*"]`',
                    stmt.value.span,
                )
                continue
            patterns = [self.string_value(i, "a pattern") for i in stmt.value.items]
            if None in patterns:
                continue
            buckets = 1
            if stmt.buckets is not None:
                buckets = ev.dim(stmt.buckets, "buckets")
                if buckets is None:
                    continue
            groups.append(
                ir.FusionGroup.model_construct(
                    span=stmt.span,
                    kind=FusionKind(kind),
                    name=name,
                    patterns=tuple(patterns),
                    buckets=buckets,
                    pattern_spans=tuple(i.span for i in stmt.value.items),
                    buckets_span=stmt.buckets.span if stmt.buckets is not None else None,
                )
            )
        return tuple(groups)
