"""What-if estimates: the spec with a few settings changed, checked and estimated
again. The budget check uses them to name changes that would fit a stage, and the
planner builds every layout it searches with them.

Settings are keyed as `--set` keys them (`mesh.dp`, `train.zero`,
`recompute.decoder`, `pipeline.schedule`...), and what follows from them (`dp`, a
written `micro_batches`) follows by the one rule `--set` uses
(msgen.ir.rederive.followers), so a what-if and `--set` with its flags are the same
spec. A variant is built on the IR, not the text, for speed: the settings are
swapped in, and when the batch (`micro_batch * dp`) changes, the shapes that
lowering evaluated with it are re-derived: it is the first dim of the network's
token input (the network takes [batch, seq]), and each layer's input takes whatever
shape the network now feeds it. The variant then goes through every check (the
budget's aside), so a change that breaks the spec is never suggested.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from msgen.analysis import graph
from msgen.analysis.facts import Facts
from msgen.analysis.plan import Plan
from msgen.checks import run_checks
from msgen.diagnostics import has_errors
from msgen.estimate.memory import Estimate, estimate
from msgen.ir.models import Recompute, Spec, TensorRef
from msgen.ir.rederive import followers
from msgen.ir.schema import RecomputeMode, Schedule
from msgen.ops import OPS

MESH_FACTORS = (2, 4, 8)  # how far one suggestion moves devices between axes
PAIR_POOL = 6  # single changes, best first, that are tried two at a time

# Cost order between kinds of change, cheapest to adopt first: recomputing the
# attention core costs a few percent of compute; ZeRO adds overlappable
# collectives; smaller micro-batches and another schedule cost efficiency;
# a new mesh moves communication onto slower links; full recompute reruns
# every forward (about a third more compute).
COST = {"select": 0, "zero": 1, "micro_batch": 2, "schedule": 3, "mesh": 4, "full": 5}


@dataclass(frozen=True)
class Change:
    family: str  # alternatives to one another: `recompute decoder`, `zero`, `mesh`...
    cost: int
    settings: tuple[tuple[str, object], ...]


@dataclass(frozen=True)
class Suggestion:
    label: str  # "recompute decoder = full"
    overrides: tuple[str, ...]  # the same as `--set` arguments
    estimate: Estimate


def merged(changes: tuple[Change, ...]) -> dict[str, object] | None:
    settings: dict[str, object] = {}
    for change in changes:
        for key, value in change.settings:
            if key in settings:
                return None
            settings[key] = value
    return settings


# building a variant -----------------------------------------------------------


def _placed(spec: Spec, settings: dict) -> Spec:
    """The spec with each `BLOCK.KEY` of `settings` swapped in (a recompute value is
    (mode, op names)); a schedule without its chunks has one."""
    blocks: dict[str, dict] = {}
    recompute = dict(spec.recompute)
    for key, value in settings.items():
        block, _, name = key.partition(".")
        if block == "recompute":
            mode, ops = value
            span = recompute[name].span if name in recompute else spec.layers[name].span
            refs = tuple(TensorRef(span=span, name=op) for op in ops)
            recompute[name] = Recompute(span=span, layer=name, mode=mode, ops=refs)
        else:
            blocks.setdefault(block, {})[name] = value
    if "schedule" in blocks.get("pipeline", {}):
        blocks["pipeline"].setdefault("chunks", 1)
    update = {b: getattr(spec, b).model_copy(update=u) for b, u in blocks.items()}
    return spec.model_copy(update={**update, "recompute": recompute})


def apply(spec: Spec, settings: dict) -> Spec | None:
    """The spec with `settings` in place and what follows from them, or None when no
    consistent spec has them."""
    variant = _placed(spec, settings)
    variant = _placed(variant, followers(variant, set(settings)))
    return rebatched(variant, spec.train.micro_batch * spec.mesh.dp)


def rebatched(spec: Spec, old_batch: int) -> Spec | None:
    batch = spec.train.micro_batch * spec.mesh.dp
    tokens = spec.network.input
    if batch == old_batch:
        return spec
    if tokens is None or not tokens.shape or tokens.shape[0] != old_batch:
        return None  # the spec does not spell its batch the usual way: leave it be
    network = spec.network.model_copy(
        update={"input": tokens.model_copy(update={"shape": (batch,) + tokens.shape[1:]})}
    )
    spec = spec.model_copy(update={"network": network})
    # a layer's input shape depends on the layers before it: one pass per layer
    for _ in range(len(spec.layers) + 1):
        facts = Facts()
        graph.order(spec, facts)
        graph.infer_shapes(spec, facts)
        fed = facts.graphs["network"].shapes
        layers = dict(spec.layers)
        for layer, node in facts.repeats.items():
            decl = layers[layer].input
            shape = fed.get(node.inputs[0].name)
            if shape is not None and shape != decl.shape:
                layers[layer] = layers[layer].model_copy(
                    update={"input": decl.model_copy(update={"shape": shape})}
                )
        if layers == spec.layers:
            return spec
        spec = spec.model_copy(update={"layers": layers})
    return None


def estimate_variant(spec: Spec, settings: dict) -> Estimate | None:
    """The estimate of the spec with `settings`, or None when that spec has errors."""
    variant = apply(spec, settings)
    if variant is None:
        return None
    facts, diags = run_checks(variant)
    if has_errors(diags):
        return None
    return estimate(Plan(variant, facts))


# describing a variant ---------------------------------------------------------


def describe(spec: Spec, settings: dict) -> tuple[str, tuple[str, ...]]:
    """How a message names the change, and the `--set` arguments that make it."""
    words, sets = [], []
    mesh: list[str] = []  # a mesh change is one phrase naming the axes it moves
    for key, value in settings.items():
        block, _, name = key.partition(".")
        if block == "recompute":
            mode, ops = value
            value = f"select({', '.join(ops)})" if mode == RecomputeMode.SELECT else mode
            words.append(f"recompute {name} = {value}")
        elif block == "mesh":
            if value == getattr(spec.mesh, name):
                continue
            if not mesh:
                words.append(mesh)
            mesh.append(f"{name} = {value}")
        else:
            words.append(f"{name} = {value}")
        sets.append(f"{key}={value}")
    words = [", ".join(w) if isinstance(w, list) else w for w in words]
    follow = followers(_placed(spec, settings), set(settings))
    if "pipeline.micro_batches" in follow:
        words[-1] += f" with micro_batches = {follow['pipeline.micro_batches']}"
        sets.append(f"pipeline.micro_batches={follow['pipeline.micro_batches']}")
    return " and ".join(words), tuple(sets)


def set_args(overrides: tuple[str, ...]) -> str:
    return " ".join(f"--set {shlex.quote(o)}" for o in overrides)


# what to try ------------------------------------------------------------------


def candidates(spec: Spec, facts: Facts) -> list[Change]:
    """Single changes worth estimating, each family's cheapest first."""
    out: list[Change] = []
    for layer in facts.order[:-1]:
        rc = spec.recompute.get(layer)
        mode = rc.mode if rc else RecomputeMode.NONE
        if mode == RecomputeMode.FULL:
            continue
        family = f"recompute {layer}"
        chosen = [r.name for r in rc.ops] if mode == RecomputeMode.SELECT else []
        composites = [
            name
            for name, of in facts.graphs[layer].ops.items()
            if OPS[of.node.kind].composite and name not in chosen
        ]
        if composites:
            value = (RecomputeMode.SELECT, tuple(chosen + composites))
            out.append(Change(family, COST["select"], ((f"recompute.{layer}", value),)))
        out.append(
            Change(family, COST["full"], ((f"recompute.{layer}", (RecomputeMode.FULL, ())),))
        )
    mesh = spec.mesh
    if mesh.dp > 1:
        for level in range(spec.train.zero + 1, 4):
            out.append(Change("zero", COST["zero"], (("train.zero", level),)))
    # more micro-batches alone never lower the peak (1F1B keeps min(n, pp - s) in
    # flight); smaller ones do, with more of them to keep global_batch
    mb = spec.train.micro_batch
    for smaller in sorted((d for d in range(1, mb) if mb % d == 0), reverse=True):
        change = (("train.micro_batch", smaller),)
        out.append(Change("micro_batch", COST["micro_batch"], change))
    if mesh.pp > 1 and spec.pipeline.schedule != Schedule.ONE_F_ONE_B:
        change = (("pipeline.schedule", Schedule.ONE_F_ONE_B),)
        out.append(Change("schedule", COST["schedule"], change))
    dp, tp, pp = mesh.dp, mesh.tp, mesh.pp
    reshapes = []
    for k in MESH_FACTORS:
        if dp % k == 0:
            reshapes += [(dp // k, tp * k, pp), (dp // k, tp, pp * k)]
        if pp % k == 0:
            reshapes.append((dp, tp * k, pp // k))
        if tp % k == 0:
            reshapes.append((dp, tp // k, pp * k))
    for r in reshapes:
        axes = tuple(zip(("mesh.dp", "mesh.tp", "mesh.pp"), r, strict=True))
        out.append(Change("mesh", COST["mesh"], axes))
    return out


def suggestions(spec: Spec, facts: Facts, limit: int = 3) -> tuple[list[Suggestion], bool]:
    """Up to `limit` changes that make every stage fit, and True; when none does
    alone, pairs of them; when no pair does either, the changes that lower the
    peak stage most, and False."""
    tried = []
    for change in candidates(spec, facts):
        est = estimate_variant(spec, dict(change.settings))
        if est is not None:
            tried.append(((change,), est))
    found = fitting(spec, tried, limit)
    if found:
        return found, True
    pool = sorted(tried, key=lambda t: t[1].peak.total_bytes)[:PAIR_POOL]
    pairs = []
    for i, (a, _) in enumerate(pool):
        for b, _ in pool[i + 1 :]:
            if a[0].family == b[0].family:
                continue
            settings = merged(a + b)
            est = estimate_variant(spec, settings) if settings is not None else None
            if est is not None:
                pairs.append((a + b, est))
    found = fitting(spec, pairs, limit)
    if found:
        return found, True
    return [suggestion(spec, c, est) for c, est in pool[:limit]], False


def fitting(spec: Spec, tried, limit: int) -> list[Suggestion]:
    """The cheapest fitting change of each family (or pair of families), cheapest
    families first."""
    best: dict[tuple[str, ...], tuple] = {}
    for order, (changes, est) in enumerate(tried):
        if not est.fits:
            continue
        key = tuple(c.family for c in changes)
        rank = (sum(c.cost for c in changes), order)
        if key not in best or rank < best[key][0]:
            best[key] = (rank, changes, est)
    chosen = sorted(best.values(), key=lambda b: b[0])[:limit]
    return [suggestion(spec, changes, est) for _, changes, est in chosen]


def suggestion(spec: Spec, changes: tuple[Change, ...], est: Estimate) -> Suggestion:
    label, overrides = describe(spec, merged(changes))
    return Suggestion(label, overrides, est)
