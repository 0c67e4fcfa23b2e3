"""plan.json: the resolved plan as data, for reviewers and tools.

`groups` lists every communicator's rank groups (msgen/ir/mesh.py, the mesh's
one owner) in full, one group a line, and `group_servers` the most servers one group
of each spans. Listing is not bounded by a cap: the world is the spec's own list of
servers times their devices, so the groups grow as the spec's `nodes` does, by at
most five ranks per device (dp, tp, pp, ep and the experts' edp); 4,096 devices of
dp 8, tp 8, pp 64 list 5,184 groups in 135 KB.
"""

from __future__ import annotations

import json

from msgen.analysis.facts import context
from msgen.analysis.gradients import gradient_sources
from msgen.analysis.placement import Repeat
from msgen.analysis.plan import Plan
from msgen.ir.mesh import RankMesh
from msgen.ops import OPS
from msgen.ops.base import split_factor


def _split(split) -> list[str]:
    return ["*".join(axes) or "1" for axes in split]


def collective_bytes(c, layout, ctx) -> int:
    """Per-device bytes of the tensor a collective reduces or gathers: its logical
    size over every other axis the op's inputs are split on."""
    used = {a for split in layout.inputs for axes in split for a in axes} - set(c.axes)
    return c.elements * ctx.dtype_bytes // split_factor(tuple(sorted(used)), ctx)


def ops_json(plan: Plan, graph: str, copies: int) -> list[dict]:
    spec = plan.spec
    ctx = context(spec)
    steps = spec.micro_batches * 2 * copies  # forward and its backward mirror, every copy
    out = []
    for name, of in plan.graph(graph).ops.items():
        entry = {"name": name, "kind": of.node.kind, "inputs": [r.name for r in of.node.inputs]}
        if of.output is not None:
            entry["shape"] = list(of.output.shape)
            entry["split"] = _split(of.output.split)
        if of.layout is not None:
            entry["input_splits"] = [_split(s) for s in of.layout.inputs]
            entry["params"] = {p.name: _split(p.split) for p in of.layout.params}
            # the fused kernels its code runs on Ascend (msgen/ops/base.py, fused_roles)
            opdef = OPS[of.node.kind]
            fused = opdef.fused_kernels(of.node, of.layout, ctx) if opdef.fused_roles else ()
            if fused:
                # a network op's stage, for the strategy files (a layer's copies have theirs)
                at = {"stage": plan.network_op_stage(of.node)} if graph == "network" else {}
                entry["fused"] = [{"primitive": p, "strategy": s} | at for p, s in fused]
            entry["collectives"] = [
                {
                    "kind": c.kind,
                    "axes": list(c.axes),
                    "what": c.what,
                    "bytes_per_step": collective_bytes(c, of.layout, ctx) * steps,
                }
                for c in of.layout.collectives
            ]
        entry["redistributions"] = [
            {
                "operand": r.operand,
                "from": _split(r.produced),
                "to": _split(r.needed),
                "bytes_per_step": r.bytes_per_device * r.times * steps,
            }
            for r in of.redistributions
        ]
        out.append(entry)
    return out


def layer_json(plan: Plan, rep: Repeat) -> dict:
    """A repeated layer: where its copies run, as runs of copies on one pipeline stage
    and, interleaved, one segment (the model chunk of that stage)."""
    placement = []
    for first, end, stage, segment in plan.placement_runs(rep):
        run = {"copies": [first, end], "stage": stage}
        if plan.interleaved:
            run["segment"] = segment
        placement.append(run)
    return {"repeat": rep.op, "count": rep.count, "placement": placement}


def gradient_from(sources: dict[str, str], pattern: str) -> dict:
    """An entry's `gradient_from`: where the step reads its gradient (msgen/analysis/
    gradients.py), when the step reads it from a mirror or a buffer at all."""
    return {"gradient_from": sources[pattern]} if sources else {}


def layer_params_json(plan: Plan, sources: dict[str, str]) -> list[dict]:
    """Parameters of repeated layers as runs: copies first .. end - 1 of `layer`,
    each with the parameter `name` (path `layer.<copy>.name`) on one stage, with
    one fusion id and one gradient source."""
    return [
        {
            "layer": run.layer,
            "name": run.name,
            "copies": [run.first, run.end],
            "shape": list(run.param.shape),
            "split": _split(run.param.split),
            "stages": [run.stage],
            "fusion_id": run.fusion_id,
        }
        | gradient_from(sources, f"{run.layer}.*.{run.name}")
        for rep in plan.repeats
        for run in plan.layer_runs(rep)
    ]


def buffers_json(plan: Plan) -> list[dict]:
    """Buffers (`Plan.buffers`), whole on their op's stage: the network's by path, the
    repeated layers' as runs of copies on one stage, as their parameters."""
    out = [
        {"path": f"{node.name}.{name}", "shape": list(shape), "split": ["1"] * len(shape),
         "stages": [plan.network_op_stage(node)]}
        for node, name, shape in plan.op_buffers("network")
    ]  # fmt: skip
    for rep in plan.repeats:
        for node, name, shape in plan.op_buffers(rep.layer):
            out += [
                {"layer": rep.layer, "name": f"{node.name}.{name}", "copies": [first, end],
                 "shape": list(shape), "split": ["1"] * len(shape), "stages": [stage]}
                for first, end, stage, _ in plan.placement_runs(rep)
            ]  # fmt: skip
    return out


GROUPS = "@groups"  # where the groups go, laid out by `_groups_text`


def _groups_text(groups: dict[str, list[list[int]]], indent: str) -> str:
    """The groups with one rank list a line (json.dumps would give each rank one)."""
    inner = indent + "  "
    axes = [
        f'{inner}"{axis}": [\n'
        + ",\n".join(f"{inner}  {json.dumps(g)}" for g in lists)
        + f"\n{inner}]"
        for axis, lists in groups.items()
    ]
    return "{\n" + ",\n".join(axes) + f"\n{indent}}}"


def plan_json(
    plan: Plan, spec_path: str, estimate: dict | None = None, sets: tuple[str, ...] = ()
) -> str:
    spec = plan.spec
    mesh = RankMesh.of(spec)
    groups = mesh.listed()
    sources = dict(gradient_sources(plan))
    doc = {
        "model": spec.model.name,
        "spec": spec_path,
        "set": list(sets),  # the --set flags it was compiled with
        "mesh": {"dp": spec.mesh.dp, "tp": spec.mesh.tp, "pp": spec.mesh.pp}
        | ({"ep": spec.mesh.ep} if spec.mesh.ep > 1 else {}),
        "devices": spec.mesh.devices,
        "per_node": mesh.per_node,
        "groups": GROUPS,
        "group_servers": {axis: mesh.spans(axis) for axis in groups},
        "micro_batches": spec.micro_batches,
        "schedule": spec.pipeline.schedule,
        "chunks": plan.chunks,
        "stage_split": list(plan.stage_split),
        "layers": {r.layer: layer_json(plan, r) for r in plan.repeats},
        "ops": {
            **{r.layer: ops_json(plan, r.layer, r.count) for r in plan.repeats},
            "network": ops_json(plan, "network", 1),
        },
        "recompute": {
            name: {"mode": rc.mode, "ops": [r.name for r in rc.ops]}
            for name, rc in sorted(spec.recompute.items())
        },
        "fusion": [
            {"name": g.name, "kind": g.kind, "patterns": list(g.patterns),
             "ids": list(plan.fusion_ids[g.name])}
            for g in spec.fusion
        ],  # fmt: skip
        "params_total": plan.params_total,
        "params": [
            {
                "path": e.path,
                "shape": list(e.param.shape),
                "split": _split(e.param.split),
                "stages": list(e.stages),
                "fusion_id": e.fusion_id,
            }
            | gradient_from(sources, e.path)
            for e in plan.network_entries()
        ],
        "layer_params": layer_params_json(plan, sources),
        "estimate": estimate,
    }
    buffers = buffers_json(plan)
    if buffers:  # the key only where there are some: other plans stay as they were
        doc["buffers"] = buffers
    text = json.dumps(doc, indent=2)
    return text.replace(json.dumps(GROUPS), _groups_text(groups, "  "), 1) + "\n"
