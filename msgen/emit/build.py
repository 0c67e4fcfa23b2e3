"""Build the templates' ModelContext from a checked Plan: strategies as MindSpore
int tuples, parameters with their init and decay, stages, fusion ids."""

from __future__ import annotations

from msgen.analysis.facts import OpFacts
from msgen.analysis.gradients import gradient_sources
from msgen.analysis.plan import DEFAULT_FUSION_ID, Plan
from msgen.analysis.switches import switches
from msgen.emit.context import LayerSpec, ModelContext, NetworkSpec, OpSpec, ParamSpec, TrainSpec
from msgen.emit.modes import TrainMode
from msgen.emit.mtp import mtp_spec
from msgen.emit.ops import EMITTERS
from msgen.estimate.flops import step_flops
from msgen.estimate.memory import budget_of
from msgen.ir.devices import DEVICES
from msgen.ir.mesh import RankMesh
from msgen.ir.schema import (
    OPTIMIZERS,
    SCHEDULES,
    LossScale,
    RecomputeMode,
    Schedule,
    with_defaults,
)
from msgen.ops import OPS
from msgen.ops.base import Context

INIT_STD = 0.02  # GPT-2 and Megatron-LM; model.py.j2's weight() default


def output_projections(graph) -> set[str]:
    """The output layers of a layer (OpDef.output_layer) whose output reaches a residual
    join through ops that only scale it: Megatron-LM's attention dense and MLP fc2,
    initialised with std 0.02 / sqrt(2 * layers). Each op says which part it plays."""
    consumers: dict[str, list] = {}
    for of in graph.ops.values():
        for ref in of.node.inputs:
            consumers.setdefault(ref.name, []).append(of.node)

    def reaches_join(name: str) -> bool:
        for node in consumers.get(name, []):
            opdef = OPS[node.kind]
            if opdef.residual_join(node):
                return True
            if opdef.scales_only(node) and reaches_join(node.name):
                return True
        return False

    return {n for n, of in graph.ops.items() if OPS[of.node.kind].output_layer and reaches_join(n)}


def op_spec(
    of: OpFacts,
    ctx: Context,
    stage: int = 0,
    recompute: bool = False,
    segment: int = 0,
    std: float | None = None,
) -> OpSpec:
    node = of.node
    args = node.args
    inputs: tuple[str | float, ...] = tuple(r.name for r in node.inputs)
    if "const" in args:
        inputs += (float(args["const"]),)
    opdef = OPS[node.kind]
    params = tuple(
        ParamSpec(p.name, p.shape, opdef.inits[p.name], p.name in opdef.decays) for p in of.params
    )
    settings = EMITTERS[node.kind].settings(node, ctx) | ({"std": std} if std is not None else {})
    return OpSpec(
        name=node.name,
        kind=node.kind,
        inputs=inputs,
        params=params,
        strategies=opdef.strategies(node, of.layout, ctx) if of.layout else (),
        recompute=recompute,
        stage=stage,
        segment=segment,
        settings=tuple(settings.items()),
    )


def train_spec(plan: Plan) -> TrainSpec:
    t = plan.spec.train
    opt = with_defaults(OPTIMIZERS, t.optimizer.name, t.optimizer.args)
    sched = with_defaults(SCHEDULES, t.schedule.name, t.schedule.args)
    warmup = int(sched["warmup"])
    if t.schedule.name == "constant":
        steps, min_lr = warmup + 1, opt["lr"]  # a cosine from lr to lr is flat
    else:
        steps, min_lr = int(sched["steps"]), float(sched["min_lr"])
    loss_scale = plan.spec.loss_scale
    scale_value = 1.0
    if loss_scale not in tuple(LossScale):  # a fixed number (MSL512: positive)
        loss_scale, scale_value = "static", float(loss_scale)
    return TrainSpec(
        micro_batch=t.micro_batch,
        global_batch=t.global_batch,
        lr=float(opt["lr"]),
        beta1=float(opt["beta1"]),
        beta2=float(opt["beta2"]),
        eps=float(opt["eps"]),
        weight_decay=float(opt["weight_decay"]),
        warmup=warmup,
        steps=steps,
        min_lr=min_lr,
        zero=t.zero,
        loss_scale=loss_scale,
        loss_scale_value=scale_value,
        grad_clip=t.grad_clip,
        checkpoint_every=t.checkpoint.every if t.checkpoint else None,
        checkpoint_keep=t.checkpoint.keep if t.checkpoint else 5,
        data=t.data,
        valid=t.valid,
        eval_every=t.eval_every,
        seed=t.seed,
        log_every=t.log_every,
    )


def fusion_tables(plan: Plan) -> tuple[tuple, tuple]:
    """The comm fusion ids of plan.json, without the default id: (network path ->
    id, per layer per `op.param` runs of copies sharing an id). A layer parameter
    has as many runs as its id changes along the copies (one per bucket), not one
    entry per copy: model.py does not grow with the layers."""
    network = tuple(
        (e.path, e.fusion_id) for e in plan.network_entries() if e.fusion_id != DEFAULT_FUSION_ID
    )
    per_layer = []
    for rep in plan.repeats:
        names: dict[str, list[list[int]]] = {}
        for run in plan.layer_runs(rep):
            runs = names.setdefault(run.name, [])
            if runs and runs[-1][1] == run.first and runs[-1][2] == run.fusion_id:
                runs[-1][1] = run.end  # the same id on the next stage
            else:
                runs.append([run.first, run.end, run.fusion_id])
        kept = []
        for name, runs in names.items():
            chosen = tuple(tuple(r) for r in runs if r[2] != DEFAULT_FUSION_ID)
            if chosen:
                kept.append((name, chosen))
        if kept:
            per_layer.append((rep.layer, tuple(kept)))
    return network, tuple(per_layer)


def gigabytes(n: int) -> str:
    """Bytes in GiB as set_memory's "xxGB" (digits and a point only, as it checks)."""
    return f"{n / 2**30:.2f}".rstrip("0").rstrip(".") + "GB"


def build_context(plan: Plan, spec_path: str, compiled_with: tuple[str, ...] = ()) -> ModelContext:
    from msgen.analysis.facts import context

    spec = plan.spec
    tied = {
        name: of.params[0]
        for name, of in plan.graph("network").ops.items()
        if of.node.kind in OPS and OPS[of.node.kind].tieable
    }
    ctx = context(spec, tied)
    selected = {
        name: {r.name for r in rc.ops}
        for name, rc in spec.recompute.items()
        if rc.mode == RecomputeMode.SELECT
    }
    copies = sum(rep.count for rep in plan.repeats)
    scaled = INIT_STD / (2 * copies) ** 0.5
    layers = []
    for rep in plan.repeats:
        graph = plan.graph(rep.layer)
        chosen = selected.get(rep.layer, set())
        projections = output_projections(graph) if spec.train.scaled_init else set()
        ops = tuple(
            op_spec(
                of,
                ctx,
                recompute=name in chosen,
                std=scaled if name in projections else None,
            )
            for name, of in graph.ops.items()
        )
        rc = spec.recompute.get(rep.layer)
        layers.append(
            LayerSpec(
                name=rep.layer,
                input=graph.graph.input.name,
                output=graph.graph.output,
                ops=ops,
                recompute=rc is not None and rc.mode == RecomputeMode.FULL,
            )
        )
    net_ops = []
    for name, of in plan.graph("network").ops.items():
        if of.node.kind == "repeat":
            rep = next(r for r in plan.repeats if r.op == name)
            net_ops.append(
                OpSpec(
                    name=name,
                    kind="repeat",
                    inputs=(of.node.inputs[0].name,),
                    layer=rep.layer,
                    count=rep.count,
                    placement=plan.placement_runs(rep),
                )
            )
        else:
            stage, segment = plan.network_op_placement(of.node)
            net_ops.append(op_spec(of, ctx, stage, segment=segment))
    network = NetworkSpec(
        input=spec.network.input.name, output=spec.network.output, ops=tuple(net_ops)
    )
    fusion, layer_fusion = fusion_tables(plan)
    budget, _ = budget_of(spec)
    mesh = RankMesh.of(spec)
    train = train_spec(plan)
    return ModelContext(
        name=spec.model.name,
        spec_path=spec_path,
        spec_sha256=spec.sha256,
        dtype=spec.model.dtype,
        param_dtype=spec.model.param_dtype,
        vocab=spec.model.dims["vocab"],
        seq=spec.model.dims["seq"],
        dp=spec.mesh.dp,
        tp=spec.mesh.tp,
        pp=spec.mesh.pp,
        dp_stride=mesh.axis_stride("dp"),
        pp_stride=mesh.axis_stride("pp"),
        micro_batches=spec.micro_batches,
        # interleaved(chunks = 1) is plain 1F1B; so is any schedule when pp = 1
        schedule=(
            Schedule.INTERLEAVED
            if plan.interleaved
            else (
                Schedule.GPIPE if spec.pipeline.schedule == Schedule.GPIPE else Schedule.ONE_F_ONE_B
            )
        ),
        layers=tuple(layers),
        network=network,
        train=train,
        mode=TrainMode.of(spec, train.loss_scale),
        chunks=plan.chunks,
        fusion=fusion,
        layer_fusion=layer_fusion,
        gradient_from=gradient_sources(plan),
        compiled_with=compiled_with,
        mtp=mtp_spec(plan, net_ops, ctx, op_spec),
        max_device_memory=gigabytes(budget) if budget else "1024GB",
        model_flops_per_step=step_flops(plan).model,
        device=spec.cluster.device,
        peak_flops=DEVICES[spec.cluster.device].peak_flops,
        switches=switches(plan),
    )
