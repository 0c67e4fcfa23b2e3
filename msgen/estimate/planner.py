"""`msgen plan`: search the parallel layouts of a spec's devices that pass every
check (the budget included) and rank them by predicted step time (or memory).

Kept from the spec: the model, the cluster, the global batch, the shard
annotations (they name mesh axes, so they follow the mesh), fusion, the
optimizer. Searched: dp · tp · pp over the devices (tp inside a node, pp at most
the layers; a written `split` pins pp), ep inside dp when the spec has moe ops (the
divisors of dp that divide every moe op's experts), the micro-batch size and count, the
ZeRO level (with dp > 1), recompute per repeated layer (none, select of its
composite ops, full), and the schedule: 1f1b, or interleaved with 2 or 4 chunks
when the layers divide (gpipe has 1f1b's bubble and more memory: never better).
The spec as written is always a candidate. A key given with `--set` is pinned:
every plan keeps the spec's value of it (`--set mesh.tp=4`: only tp = 4).

Plans that keep the 10% fragmentation headroom on every stage (those `check`
does not warn MSL402 about) rank before those that only fit.

A layout's graph facts depend only on its mesh and micro-batch, so the front
end runs once per pair; every variant then runs the independent check passes,
is pruned by its memory estimate, and only fitting ones are timed. A plan's
`--set` flags give `msgen estimate` the same spec, so the same numbers (a test
holds it).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

from msgen.analysis.plan import Plan
from msgen.checks import INDEPENDENT_PASSES, run_checks
from msgen.diagnostics import has_errors
from msgen.estimate.activations import recompute_label
from msgen.estimate.memory import Estimate, estimate
from msgen.estimate.time import StepTime, step_time
from msgen.estimate.whatif import apply
from msgen.ir.devices import Device
from msgen.ir.models import Spec
from msgen.ir.schema import RecomputeMode, Schedule
from msgen.ops import OPS
from msgen.syntax.overrides import override_keys

CHUNKS = (2, 4)
MAX_MICRO_BATCH = 16


@dataclass(frozen=True)
class Layout:
    """One candidate: what `--set` writes, in a fixed order."""

    dp: int
    tp: int
    pp: int
    micro_batch: int
    micro_batches: int
    zero: int
    recompute: tuple[tuple[str, str], ...]  # (layer, mode as MSL writes it)
    schedule: str  # 1f1b | gpipe | interleaved(chunks = N)
    ep: int | None = None  # None: the spec has no moe op, ep is not searched

    @property
    def sets(self) -> tuple[str, ...]:
        out = [
            f"mesh.dp={self.dp}",
            f"mesh.tp={self.tp}",
            f"mesh.pp={self.pp}",
            *([f"mesh.ep={self.ep}"] if self.ep is not None else []),
            f"train.micro_batch={self.micro_batch}",
            f"pipeline.micro_batches={self.micro_batches}",
            f"train.zero={self.zero}",
        ]
        out += [f"recompute.{layer}={mode}" for layer, mode in self.recompute]
        out.append(f"pipeline.schedule={self.schedule}")
        return tuple(out)

    def keeps(self, other: Layout, pinned: frozenset[str]) -> bool:
        """Whether this layout has `other`'s value of every pinned key (a pinned
        `pipeline.chunks` pins the schedule that holds it)."""
        pinned = pinned | ({"pipeline.schedule"} if "pipeline.chunks" in pinned else set())
        mine, theirs = dict(s.split("=", 1) for s in self.sets), dict(
            s.split("=", 1) for s in other.sets
        )
        return all(mine[k] == theirs[k] for k in pinned if k in mine)


@dataclass(frozen=True)
class Ranked:
    layout: Layout
    estimate: Estimate
    time: StepTime

    @property
    def peak_bytes(self) -> int:
        return self.estimate.peak.total_bytes

    @property
    def headroom_kept(self) -> bool:
        """Every stage fits with the 10% fragmentation headroom on top (no MSL402)."""
        return not any(s.tight for s in self.estimate.stages)


@dataclass(frozen=True)
class Search:
    spec: Ranked | None  # the spec as written (None: it has errors besides the budget)
    spec_fits: bool
    plans: tuple[Ranked, ...]  # fitting, best first
    searched: int
    fitting: int
    smallest: Ranked | None  # when nothing fits: the layout with the lowest peak
    fixed: tuple[str, ...] = ()  # the --set values searched from that no layout sets

    def flags(self, r: Ranked) -> tuple[str, ...]:
        """Every `--set` that gives `r`: the fixed ones, then the layout's."""
        return self.fixed + r.layout.sets


def written(spec: Spec, layers: list[str]) -> Layout:
    pipe = spec.pipeline
    schedule = (
        f"interleaved(chunks = {pipe.chunks})"
        if pipe.schedule == Schedule.INTERLEAVED
        else pipe.schedule
    )
    return Layout(
        spec.mesh.dp,
        spec.mesh.tp,
        spec.mesh.pp,
        spec.train.micro_batch,
        spec.micro_batches,
        spec.train.zero,
        tuple((layer, recompute_label(spec.recompute.get(layer))) for layer in layers),
        schedule,
        spec.mesh.ep if experts_of(spec) else None,
    )


def experts_of(spec: Spec) -> list[int]:
    """The expert counts of the spec's moe ops (none: ep is not searched)."""
    graphs = [spec.network, *spec.layers.values()]
    return [op.args["experts"] for g in graphs for op in g.ops if op.kind == "moe"]


def expert_parallel(spec: Spec, dp: int) -> list[int | None]:
    """The ep values a layout with `dp` may take: divisors of dp dividing every moe
    op's experts; [None] without moe ops."""
    experts = experts_of(spec)
    if not experts:
        return [None]
    return [e for e in divisors(dp, dp) if all(n % e == 0 for n in experts)]


def divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def recompute_modes(spec: Spec, layers: list[str], graphs) -> list[tuple[tuple[str, str], ...]]:
    """Per repeated layer: none, select of its composite ops (the attention core), full."""
    options = []
    for layer in layers:
        cores = [n for n, of in graphs[layer].ops.items() if OPS[of.node.kind].composite]
        modes = ["none"] + ([f"select({', '.join(cores)})"] if cores else []) + ["full"]
        options.append([(layer, m) for m in modes])
    return [tuple(sorted(combo)) for combo in product(*options)]


def layouts(spec: Spec, layers_total: int, modes) -> list[Layout]:
    devices = spec.mesh.devices
    per_node = max(1, spec.cluster.per_node)
    batch = spec.train.global_batch
    pp_pinned = spec.pipeline.split is not None
    out = []
    for tp in divisors(devices, per_node):
        if per_node % tp:
            continue
        for pp in divisors(devices // tp, layers_total):
            if pp_pinned and pp != spec.mesh.pp:
                continue
            dp = devices // (tp * pp)
            for b in divisors(batch, MAX_MICRO_BATCH):
                if batch % (b * dp):
                    continue
                n = batch // (b * dp)
                if n < pp:
                    continue
                schedules = ["1f1b"]
                if pp > 1 and not pp_pinned:
                    schedules += [f"interleaved(chunks = {c})" for c in CHUNKS
                                  if layers_total % (pp * c) == 0]  # fmt: skip
                for zero, ep in product(
                    range(4) if dp > 1 else (spec.train.zero,), expert_parallel(spec, dp)
                ):
                    for rc in modes:
                        for schedule in schedules:
                            out.append(Layout(dp, tp, pp, b, n, zero, rc, schedule, ep))
    return out


def settings_of(layout: Layout) -> dict:
    """The layout as `whatif.apply` settings: its `--set` keys, typed; micro_batches
    given, so nothing is re-derived."""
    settings: dict = {
        "mesh.dp": layout.dp,
        "mesh.tp": layout.tp,
        "mesh.pp": layout.pp,
        "train.micro_batch": layout.micro_batch,
        "pipeline.micro_batches": layout.micro_batches,
        "train.zero": layout.zero,
    }
    if layout.ep is not None:
        settings["mesh.ep"] = layout.ep
    for layer, mode in layout.recompute:
        if mode.startswith("select("):
            settings[f"recompute.{layer}"] = (RecomputeMode.SELECT, tuple(mode[7:-1].split(", ")))
        else:
            settings[f"recompute.{layer}"] = (mode, ())
    if layout.schedule.startswith("interleaved"):
        settings["pipeline.schedule"] = Schedule.INTERLEAVED
        settings["pipeline.chunks"] = int(layout.schedule.split("=")[1].strip(" )"))
    else:
        settings["pipeline.schedule"] = Schedule(layout.schedule)
    return settings


def rank_key(objective: str):
    def key(r: Ranked):
        first = (
            (r.time.step_s, r.peak_bytes) if objective == "time" else (r.peak_bytes, r.time.step_s)
        )
        return (not r.headroom_kept,) + first + (r.layout.sets,)

    return key


def search(
    spec: Spec,
    facts,
    objective: str = "time",
    top: int = 5,
    given: tuple[str, ...] = (),
    device: Device | None = None,
) -> Search:
    """Every layout of the spec's devices that keeps the values of the keys `given` with
    `--set` (the spec holds them), checked, estimated, and the fitting ones timed (on
    `device` when given: a calibration of the spec's)."""
    layers_total = sum(r.count for r in Plan(spec, facts).repeats)
    layer_names = sorted({n.args["layer"] for n in spec.network.ops if n.kind == "repeat"})
    modes = recompute_modes(spec, layer_names, facts.graphs)
    mine = written(spec, layer_names)
    pinned = frozenset(override_keys(list(given)))
    searched_keys = override_keys(list(mine.sets))
    fixed = tuple(s for s in given if not override_keys([s]) & searched_keys)
    candidates = [c for c in layouts(spec, layers_total, modes) if c.keeps(mine, pinned)]
    if mine not in candidates:
        candidates.append(mine)
    graph_facts: dict[tuple, object] = {}
    fitting: list[Ranked] = []
    smallest: Ranked | None = None
    searched = 0
    for layout in candidates:
        v = apply(spec, settings_of(layout))
        if v is None:
            continue
        group = (layout.dp, layout.tp, layout.pp, layout.micro_batch, layout.ep)
        if group not in graph_facts:
            f, diags = run_checks(v)
            graph_facts[group] = None if has_errors(diags) else f
        f = graph_facts[group]
        if f is None:
            continue
        if any(has_errors(check.run(v, f)) for check in INDEPENDENT_PASSES):
            continue
        searched += 1
        plan = Plan(v, f)
        est = estimate(plan)
        if not est.fits:
            if smallest is None or est.peak.total_bytes < smallest.peak_bytes:
                smallest = Ranked(layout, est, step_time(plan, est, device))
            continue
        timing = step_time(plan, est, device)
        if timing is not None:
            fitting.append(Ranked(layout, est, timing))
    fitting.sort(key=rank_key(objective))
    as_written = next((r for r in fitting if r.layout == mine), None)
    spec_fits = as_written is not None
    if as_written is None:
        plan = Plan(spec, facts)
        est = estimate(plan)
        timing = step_time(plan, est, device)
        as_written = Ranked(mine, est, timing) if timing else None
    return Search(
        as_written, spec_fits, tuple(fitting[:top]), searched, len(fitting), smallest, fixed
    )
