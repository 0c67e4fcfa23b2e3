"""Lower the AST to the IR: evaluate values, apply defaults, build op graphs.

Lowering reports what it cannot represent (unknown blocks and keys, values of
the wrong type, dims that do not evaluate); names of tensors, layers and mesh
axes are left for the check passes to resolve.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from msgen.diagnostics import Diagnostic, Span, did_you_mean
from msgen.ir import models as ir
from msgen.ir.schema import (
    BLOCK_KINDS,
    REQUIRED_BLOCKS,
)
from msgen.lowering.blocks import BlockLowering
from msgen.lowering.cluster import ClusterLowering
from msgen.lowering.evaluate import Evaluator
from msgen.lowering.graph import GraphLowering
from msgen.syntax import ast


class Lowering(BlockLowering, ClusterLowering, GraphLowering):
    """The whole spec: its blocks in order, then the IR and the hash of what it read."""

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


def lower(
    module: ast.Module, text: str, file: str, base_dir: Path
) -> tuple[ir.Spec | None, list[Diagnostic]]:
    lowering = Lowering(module, file, base_dir)
    lowering.sources.append(text.encode())
    spec = lowering.lower()
    return spec, lowering.diags
