"""Lower the AST to the IR: evaluate values, apply defaults, build op graphs.

Lowering reports what it cannot represent (unknown blocks and keys, values of
the wrong type, dims that do not evaluate); names of tensors, layers and mesh
axes are left for the check passes to resolve.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from msgen.diagnostics import Diagnostic, Span, did_you_mean, error, format_bytes, warning
from msgen.ir import models as ir
from msgen.ir.schema import (
    BLOCK_KINDS,
    EVAL_EVERY,
    KEYS,
    MODEL_KEYS,
    MODEL_REQUIRED,
    REQUIRED,
    REQUIRED_BLOCKS,
    Dtype,
    FusionKind,
    LossScale,
    RecomputeMode,
    Schedule,
)
from msgen.lowering.evaluate import UNIT_BYTES, DefinedAfter, Evaluator
from msgen.ops import OPERATORS, OPS
from msgen.syntax import ast
from msgen.syntax.parser import read_regular

HCCN_LIMIT = 2**20  # an hccn.conf for 16 NPUs is under 2 KiB
DTYPES = tuple(Dtype)


class Lowering:
    def __init__(self, module: ast.Module, file: str, base_dir: Path):
        self.module = module
        self.file = file
        self.base_dir = base_dir
        self.diags: list[Diagnostic] = []
        self.sources: list[bytes] = []  # files the spec reads: part of its hash
        self.failed_dims: set[str] = set()  # model dims already reported as invalid

    # helpers ---------------------------------------------------------------

    def err(self, code, message, span, hint=None):
        self.diags.append(error(code, message, span, hint))

    def keyed(self, block: ast.Block, kind: str) -> dict[str, ast.Assign]:
        """A block's `key = value` statements by key, reporting unknown, duplicate
        and missing keys and statements that do not belong in such a block."""
        known = KEYS[kind]
        out: dict[str, ast.Assign] = {}
        for stmt in block.stmts:
            if not isinstance(stmt, ast.Assign):
                self.err("MSL104", f"this statement does not belong in a `{kind}` block", stmt.span)
                continue
            key = stmt.target.name
            if key not in known:
                hint = did_you_mean(key, known) or f"{kind} keys: {', '.join(known)}"
                self.err("MSL104", f"unknown key `{key}` in `{kind}`", stmt.target.span, hint)
            elif key in out:
                self.err(
                    "MSL102",
                    f"`{key}` is set twice in `{kind}`",
                    stmt.target.span,
                    f"first set on line {out[key].span.line}",
                )
            else:
                out[key] = stmt
        for key, required in known.items():
            if required and key not in out:
                self.err(
                    "MSL105",
                    f"`{kind}` needs `{key}`",
                    block.kind.span,
                    f"add `{key} = ...` to the `{kind}` block",
                )
        return out

    def name_value(self, stmt: ast.Assign, choices=None) -> str | None:
        v = stmt.value
        if not isinstance(v, ast.Name):
            self.err(
                "MSL108",
                f"`{stmt.target.name}` takes a name",
                v.span,
                f"one of: {', '.join(choices)}" if choices else None,
            )
            return None
        if choices and v.name not in choices:
            code = "MSL508" if set(choices) <= set(DTYPES) | {"none"} else "MSL108"
            self.err(
                code,
                f"`{v.name}` is not a valid `{stmt.target.name}`",
                v.span,
                did_you_mean(v.name, choices) or f"one of: {', '.join(choices)}",
            )
            return None
        return v.name

    def string_value(self, expr: ast.Expr, what: str) -> str | None:
        if isinstance(expr, ast.String):
            return expr.value
        self.err("MSL108", f"{what} must be a string in double quotes", expr.span)
        return None

    def path_value(self, expr: ast.Expr, what: str) -> str | None:
        """A string naming a file: never empty (`mindrecord("")` is not "no data")."""
        value = self.string_value(expr, what)
        if value == "":
            self.err("MSL108", f"{what} is empty", expr.span, "no data is written `data = none`")
            return None
        return value

    def call(self, expr: ast.Expr, what: str, ev: Evaluator) -> ir.Call | None:
        if isinstance(expr, ast.Name):
            return ir.Call.model_construct(span=expr.span, name=expr.name)
        if not isinstance(expr, ast.Call) or expr.args:
            self.err("MSL108", f"{what} is written `name(key = value, ...)`", expr.span)
            return None
        args, spans = {}, {}
        for kw in expr.kwargs:
            if kw.name.name in spans:  # as an op's (MSL115): never the last one winning
                self.err("MSL115", f"`{kw.name.name}` is given twice", kw.name.span)
                return None
            spans[kw.name.name] = kw.span
            value = self.scalar(kw.value, ev)
            if value is not None:
                args[kw.name.name] = value
        spans = {k: v for k, v in spans.items() if k in args}
        return ir.Call.model_construct(
            span=expr.span, name=expr.func.name, args=args, arg_spans=spans
        )

    def scalar(self, expr: ast.Expr, ev: Evaluator):
        """A number, a bool (`true`/`false`), a name, or a string."""
        if isinstance(expr, ast.Name) and expr.name in ("true", "false"):
            return expr.name == "true"
        if isinstance(expr, ast.Name) and expr.name not in ev.env:
            return expr.name
        if isinstance(expr, ast.String):
            return expr.value
        return ev.number(expr)

    def spans_of(self, stmts: dict[str, ast.Assign]) -> dict[str, Span]:
        return {k: s.span for k, s in stmts.items()}

    # blocks ----------------------------------------------------------------

    def lower(self) -> ir.Spec | None:
        blocks: dict[str, ast.Block] = {}
        layers: dict[str, ast.Block] = {}
        version = self.module.version
        if version is not None and (
            version.keyword.name != "msl" or version.number.text not in ("0.1",)
        ):
            self.err(
                "MSL004",
                f"unsupported version line `{version.keyword.name} " f"{version.number.text}`",
                version.span,
                "this msgen reads `msl 0.1`",
            )
        for block in self.module.blocks:
            kind = block.kind.name
            if kind not in BLOCK_KINDS:
                self.err(
                    "MSL103",
                    f"unknown block `{kind}`",
                    block.kind.span,
                    did_you_mean(kind, BLOCK_KINDS) or f"blocks: {', '.join(BLOCK_KINDS)}",
                )
                continue
            if kind == "layer":
                if block.name is None:
                    self.err("MSL105", "a layer needs a name: `layer NAME {`", block.kind.span)
                elif block.name.name in layers:
                    self.err(
                        "MSL102", f"layer `{block.name.name}` is defined twice", block.name.span
                    )
                else:
                    layers[block.name.name] = block
                continue
            if kind == "model" and block.name is None:
                self.err("MSL105", "the model needs a name: `model NAME {`", block.kind.span)
            elif kind != "model" and block.name is not None:
                self.err("MSL001", f"a `{kind}` block takes no name", block.name.span)
            if kind in blocks:
                self.err(
                    "MSL102",
                    f"block `{kind}` appears twice",
                    block.kind.span,
                    f"first on line {blocks[kind].span.line}",
                )
                continue
            blocks[kind] = block
        eof = Span(file=self.file, line=1, col=1, end_line=1, end_col=2)
        for kind in REQUIRED_BLOCKS:
            if kind not in blocks:
                self.err(
                    "MSL122",
                    f"the spec has no `{kind}` block",
                    eof,
                    f"add a `{kind} {{ ... }}` block (see `msgen explain MSL122`)",
                )
        if any(k not in blocks for k in REQUIRED_BLOCKS) or (
            "model" in blocks and blocks["model"].name is None
        ):
            return None

        model = self.lower_model(blocks["model"])
        mesh = self.lower_mesh(blocks["mesh"])
        ev = Evaluator(dict(model.dims), self.diags, failed=self.failed_dims)
        train = self.lower_train(blocks["train"], ev)
        shape_env = dict(model.dims)
        shape_env["batch"] = train.micro_batch * mesh.dp
        cluster = self.lower_cluster(blocks["cluster"], ev)
        pipeline = self.lower_pipeline(blocks.get("pipeline"), ev)
        budget = self.lower_budget(blocks.get("budget"), ev)
        graphs = {name: self.lower_graph(b, shape_env, name) for name, b in layers.items()}
        network = self.lower_graph(blocks["network"], shape_env, "network")
        recompute = self.lower_recompute(blocks.get("recompute"))
        fusion = self.lower_fusion(blocks.get("fusion"), ev)
        sha = hashlib.sha256()
        for chunk in self.sources:
            sha.update(hashlib.sha256(chunk).digest())
        return ir.Spec.model_construct(
            file=self.file, sha256=sha.hexdigest(), model=model, cluster=cluster, mesh=mesh,
            layers=graphs, network=network, recompute=recompute, pipeline=pipeline,
            fusion=fusion, train=train, budget=budget,
            block_spans={k: b.span for k, b in blocks.items()}
            | {f"layer {k}": b.span for k, b in layers.items()},
        )  # fmt: skip

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
            elif key in ("optimizer", "schedule"):
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

    def lower_cluster(self, block: ast.Block, ev: Evaluator) -> ir.Cluster:
        stmts = self.keyed(block, "cluster")
        values: dict = {}
        for key, stmt in stmts.items():
            v = stmt.value
            if key == "device":
                values[key] = self.name_value(stmt)
            elif key in ("per_node", "master_port"):
                values[key] = ev.dim(v, key)
            elif key == "nodes":
                if isinstance(v, ast.List):
                    items = [self.string_value(i, "a node address") for i in v.items]
                    values[key] = tuple(i for i in items if i is not None)
                    values["node_spans"] = tuple(i.span for i in v.items)
                else:
                    self.err("MSL108", 'nodes is a list of addresses: `["10.0.0.1", ...]`', v.span)
            elif key == "device_ips":
                ips, sources, spans, files = self.device_ips(v)
                values[key] = ips
                values["device_ip_sources"] = sources
                values["device_ip_spans"] = spans
                values["device_ip_files"] = files
        values = {k: v for k, v in values.items() if v is not None}
        return ir.Cluster.model_construct(span=block.span, spans=self.spans_of(stmts), **values)

    def device_ips(self, expr):
        """`hccn("f")`, or a list with one entry per node: `hccn("f")` or a list of IPs.
        Returns the IPs per node, the files read, and per node the IPs' spans and file."""
        entries = [expr] if isinstance(expr, ast.Call) else None
        if isinstance(expr, ast.List):
            entries = list(expr.items)
            if entries and all(isinstance(e, ast.String) for e in entries):
                entries = [expr]  # one node written as a flat list of IPs
        if entries is None:
            self.err(
                "MSL108",
                'device_ips is `hccn("file")` or a list with one entry per ' "node",
                expr.span,
            )
            return None, (), (), ()
        nodes, sources, spans, files = [], [], [], []
        for entry in entries:
            if isinstance(entry, ast.Call) and entry.func.name == "hccn" and len(entry.args) == 1:
                path = self.string_value(entry.args[0], "the hccn.conf path")
                if path is None:
                    return None, (), (), ()
                ips = self.read_hccn(path, entry.span)
                if ips is None:
                    return None, (), (), ()
                nodes.append(ips)
                sources.append(path)
                spans.append(tuple(entry.span for _ in ips))
                files.append(path)
            elif isinstance(entry, ast.List):
                items = [self.string_value(i, "a device IP") for i in entry.items]
                if None in items:
                    return None, (), (), ()
                nodes.append(tuple(items))
                spans.append(tuple(i.span for i in entry.items))
                files.append(None)
            else:
                self.err(
                    "MSL108",
                    'each node\'s device IPs are `hccn("file")` or a list of ' "IPs",
                    entry.span,
                )
                return None, (), (), ()
        return tuple(nodes), tuple(sources), tuple(spans), tuple(files)

    def read_hccn(self, path: str, span: Span) -> tuple[str, ...] | None:
        try:
            data = read_regular(self.base_dir / path, HCCN_LIMIT)
        except OSError as exc:
            self.err(
                "MSL309",
                f"cannot read `{path}`: {exc.strerror or exc}",
                span,
                f"the path is relative to the spec's folder; hccn.conf is a regular file "
                f"of at most {format_bytes(HCCN_LIMIT)}",
            )
            return None
        self.sources.append(data)
        found: dict[int, str] = {}
        for lineno, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            m = re.fullmatch(r"\s*address_0*(\d+)\s*=\s*(\S+)\s*", line)
            if m and len(m.group(1)) > 9:  # never int() of 4,300 digits and more
                self.err("MSL309", f"`{path}` line {lineno} numbers a device past 10^9", span)
                return None
            if m:
                found[int(m.group(1))] = m.group(2)
            elif line.strip() and not re.match(r"\s*(#|\w+_\d+\s*=)", line):
                # quote the key at most: the file may be anything (never its lines)
                key = re.match(r"\s*(\w{1,40})\s*=", line)
                what = f" (key {key.group(1)!r})" if key else ""
                self.err(
                    "MSL309",
                    f"`{path}` line {lineno} is not `key_N=value`{what}",
                    span,
                    "hccn.conf lines read `address_N=IP`",
                )
                return None
        if not found:
            self.err("MSL309", f"`{path}` has no `address_N=IP` lines", span)
            return None
        if sorted(found) != list(range(len(found))):
            self.err(
                "MSL309",
                f"`{path}` numbers its devices {sorted(found)}; expected "
                f"0..{len(found) - 1} without gaps",
                span,
            )
            return None
        return tuple(found[i] for i in range(len(found)))

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

    # graphs ----------------------------------------------------------------

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
        if args.get("tie") and params:
            self.err(
                "MSL209",
                f"`{name}` is tied to `{args['tie']}` and owns no parameters",
                next(iter(params.values())).span,
                f"split the table where `{args['tie']}` defines it",
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


def names_in(node) -> Iterator[str]:
    """Every name a syntax subtree mentions, definitions included."""
    if isinstance(node, ast.Name):
        yield node.name
    elif isinstance(node, (tuple, list)):
        for item in node:
            yield from names_in(item)
    elif dataclasses.is_dataclass(node):
        for f in dataclasses.fields(node):
            yield from names_in(getattr(node, f.name))


def lower(
    module: ast.Module, text: str, file: str, base_dir: Path
) -> tuple[ir.Spec | None, list[Diagnostic]]:
    lowering = Lowering(module, file, base_dir)
    lowering.sources.append(text.encode())
    spec = lowering.lower()
    return spec, lowering.diags
