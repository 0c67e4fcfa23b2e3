"""Per op and per parameter, what the two sides' plans say: the op's call, the
strategy tuples model.py passes to `shard`, the fused kernels it runs on Ascend,
the collectives plan.json says they imply, the recompute marks; each parameter's shape, split, stages and fusion id,
a repeated layer's as runs of copies, as plan.json lists them."""

from __future__ import annotations

from collections.abc import Iterable

from msgen.emit.context import ModelContext, OpSpec
from msgen.ir.models import Spec
from msgen.review.model import OpChange, ParamChange
from msgen.review.settings import show

OP_ASPECTS = ("call", "strategy", "fused", "collectives", "recompute")
PARAM_ASPECTS = ("shape", "split", "stages", "fusion_id", "gradient_from")
LAYER = "(layer)"  # the op name of a layer's own recompute mark


def _calls(spec: Spec) -> dict[tuple[str, str], str]:
    out = {}
    for graph in (*spec.layers.values(), spec.network):
        for node in graph.ops:
            args = [r.name for r in node.inputs]
            args += [f"{k} = {show(v)}" for k, v in node.args.items()]
            out[(graph.name, node.name)] = f"{node.kind}({', '.join(args)})"
    return out


def _collectives(entry: dict) -> str | None:
    found = [
        f"{c['kind']} over {'*'.join(c['axes'])} ({c['what']})"
        for c in entry.get("collectives", [])
    ]
    found += [
        f"redistribute {r['operand']} [{', '.join(r['from'])}] → [{', '.join(r['to'])}]"
        for r in entry["redistributions"]
    ]
    return "; ".join(found) or None


def _fused(entry: dict) -> str | None:
    """The fused kernels the op runs on Ascend (plan.json's `fused`), with strategies."""
    found = [
        f"{k['primitive']} {tuple(tuple(s) for s in k['strategy'])}" for k in entry.get("fused", [])
    ]
    return "; ".join(found) or None


def _op(op: OpSpec) -> dict[str, str | None]:
    strategy = "; ".join(f"{role} {strategy}" for role, strategy in op.strategies)
    return {"strategy": strategy or None, "recompute": "selected" if op.recompute else None}


def op_facts(spec: Spec, context: ModelContext, plan: dict) -> dict[tuple[str, str], dict]:
    """(graph, op) -> aspect -> its text (None: the op has none)."""
    out: dict[tuple[str, str], dict] = {}
    for layer in context.layers:
        rc = spec.recompute.get(layer.name)
        out[(layer.name, LAYER)] = {"recompute": show(rc.mode) if rc else "none"}
        out |= {(layer.name, op.name): _op(op) for op in layer.ops}
    out |= {("network", op.name): _op(op) for op in context.network.ops if op.kind != "repeat"}
    for key, call in _calls(spec).items():
        if key in out:
            out[key]["call"] = call
    for graph, entries in plan["ops"].items():
        for entry in entries:
            if (graph, entry["name"]) in out:
                out[(graph, entry["name"])]["collectives"] = _collectives(entry)
                out[(graph, entry["name"])]["fused"] = _fused(entry)
    return out


def compare_ops(old: dict, new: dict) -> list[OpChange]:
    out = []
    for graph, op in _union(old, new):
        a, b = old.get((graph, op), {}), new.get((graph, op), {})
        for aspect in OP_ASPECTS:
            if a.get(aspect) != b.get(aspect):
                out.append(OpChange(graph=graph, op=op, aspect=aspect, old=a.get(aspect),
                                    new=b.get(aspect)))  # fmt: skip
    return out


def _list(values: Iterable) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


def _runs(runs: list[tuple[int, int, str]]) -> str:
    """One value, or `first-last: value` per run of copies sharing it."""
    merged: list[list] = []
    for first, end, value in runs:
        if merged and merged[-1][2] == value and merged[-1][1] == first:
            merged[-1][1] = end
        else:
            merged.append([first, end, value])
    if len(merged) == 1:
        return merged[0][2]
    return ", ".join(
        f"{first if end - first == 1 else f'{first}-{end - 1}'}: {value}"
        for first, end, value in merged
    )


def _param(entry: dict) -> dict[str, str]:
    return {
        "shape": _list(entry["shape"]),
        "split": _list(entry["split"]),
        "stages": _list(entry["stages"]),
        "fusion_id": str(entry["fusion_id"]),
        # "none": the step reads no mirror or buffer (one micro-batch, or data parallel)
        "gradient_from": entry.get("gradient_from", "none"),
    }


def param_facts(plan: dict) -> dict[str, dict[str, str]]:
    """Path (LAYER.*.OP.NAME for a repeated layer's) -> aspect -> its text."""
    out = {e["path"]: _param(e) for e in plan["params"]}
    runs: dict[str, list[dict]] = {}
    for run in plan["layer_params"]:
        runs.setdefault(f"{run['layer']}.*.{run['name']}", []).append(run)
    for layer, entry in plan["layers"].items():
        out[f"{layer}.*"] = {"copies": str(entry["count"])}
    for path, found in runs.items():
        out[path] = {
            aspect: _runs([(r["copies"][0], r["copies"][1], _param(r)[aspect]) for r in found])
            for aspect in PARAM_ASPECTS
        }
    return out


def compare_params(old: dict, new: dict) -> list[ParamChange]:
    """Changes grouped: the parameters that change the same way share a row."""
    rows: dict[tuple, list[str]] = {}
    for path in _union(old, new):
        a, b = old.get(path), new.get(path)
        if a is None or b is None:
            there = a or b
            text = there.get("shape") or there.get("copies")
            rows.setdefault(("param", *((None, text) if a is None else (text, None))), []).append(
                path
            )
            continue
        for aspect in ("copies", *PARAM_ASPECTS):
            if a.get(aspect) != b.get(aspect):
                rows.setdefault((aspect, a.get(aspect), b.get(aspect)), []).append(path)
    return [
        ParamChange(params=paths, aspect=aspect, old=old_text, new=new_text)
        for (aspect, old_text, new_text), paths in rows.items()
    ]


def _union(old: dict, new: dict) -> list:
    """NEW's keys in order, then those only OLD has."""
    return [*new, *(k for k in old if k not in new)]
