"""Training settings: batch arithmetic, the optimizer and learning-rate schedule
(known names and arguments, values in range), zero, loss scale and gradient
clipping, and the fusion groups (msgen/checks/fusion.py: buckets, patterns that match
no parameter, what an `allgather` or `reducescatter` group does).
"""

from __future__ import annotations

from msgen.analysis.facts import Facts
from msgen.checks.evaluation import check_evaluation
from msgen.checks.fusion import check_buckets, check_fusion_kinds, check_patterns
from msgen.diagnostics import Diagnostic, Span, did_you_mean, error
from msgen.ir.models import Call, Spec
from msgen.ir.schema import OPTIMIZERS, REQUIRED, SCHEDULES, LossScale

ZERO_LEVELS = (0, 1, 2, 3)
SEED_LIMIT = 2**32

# Ranges of the optimizer's arguments: (test, what the message says it must be).
ADAMW_RANGES = {
    "lr": (lambda v: v > 0, "> 0"),
    "beta1": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "beta2": (lambda v: 0 <= v < 1, "in [0, 1)"),
    "eps": (lambda v: v > 0, "> 0"),
    "weight_decay": (lambda v: v >= 0, ">= 0"),
}


def is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def name_span(call: Call) -> Span:
    """The span of a call's name (`adamw` in `adamw(lr = ...)`)."""
    return call.span.first(len(call.name))


def fmt_num(v) -> str:
    """A number as a spec would write it: 0.001, 1e-08, 1.0, 4."""
    if not isinstance(v, float):
        return str(v)
    text = f"{v:g}"
    return text if any(c in text for c in ".einf") else text + ".0"


# batch ------------------------------------------------------------------------


def check_batch(spec: Spec) -> list[Diagnostic]:
    train, dp = spec.train, spec.mesh.dp
    per_step = train.micro_batch * dp
    span = train.spans.get("global_batch", train.span)
    mbs = spec.pipeline.micro_batches
    if mbs is not None:
        want = per_step * mbs
        if train.global_batch == want:
            return []
        hint = f"set global_batch = {want}"
        if train.global_batch % per_step == 0:
            hint += f", or micro_batches = {train.global_batch // per_step}"
        return [
            error(
                "MSL501",
                f"global_batch = {train.global_batch}, but micro_batch * dp * micro_batches = "
                f"{train.micro_batch} * {dp} * {mbs} = {want}",
                span,
                hint,
            )
        ]
    if train.global_batch % per_step == 0:
        return []
    lower = train.global_batch // per_step * per_step
    tries = [n for n in (lower, lower + per_step) if n > 0]
    return [
        error(
            "MSL501",
            f"global_batch = {train.global_batch} is not a multiple of micro_batch * dp = "
            f"{train.micro_batch} * {dp} = {per_step}",
            span,
            "the micro-batches per step are global_batch / (micro_batch * dp): try "
            + " or ".join(f"global_batch = {n}" for n in tries),
        )
    ]


# optimizer and schedule -------------------------------------------------------


def known_call(
    call: Call, table: dict[str, dict[str, object]], code: str, what: str
) -> list[Diagnostic]:
    """The call names an entry of `table` with known arguments, all numbers, and the
    required ones given."""
    signature = ", ".join(f"{n}({', '.join(args)})" for n, args in table.items())
    if call.name not in table:
        return [
            error(
                code,
                f"unknown {what} `{call.name}`",
                name_span(call),
                did_you_mean(call.name, table) or f"msgen knows: {signature}",
            )
        ]
    known = table[call.name]
    diags = []
    for arg, value in call.args.items():
        span = call.arg_spans.get(arg, call.span)
        if arg not in known:
            diags.append(
                error(
                    code,
                    f"{call.name} has no argument `{arg}`",
                    span,
                    did_you_mean(arg, known) or f"{call.name}({', '.join(known)})",
                )
            )
        elif not is_number(value):
            diags.append(
                error(
                    "MSL108",
                    f"`{arg}` of {call.name} must be a number, got `{str(value).lower()}`",
                    span,
                )
            )
    for arg, default in known.items():
        if default is REQUIRED and arg not in call.args:
            diags.append(
                error(
                    code,
                    f"{call.name} needs `{arg}`",
                    call.span,
                    f"{call.name}({', '.join(known)}); e.g. `{call.name}({arg} = ...)`",
                )
            )
    return diags


def numeric_args(call: Call, table) -> dict[str, float | int]:
    known = table.get(call.name, {})
    return {k: v for k, v in call.args.items() if k in known and is_number(v)}


def check_optimizer(spec: Spec) -> tuple[list[Diagnostic], float | None]:
    """Diagnostics, and the learning rate when it is valid (the schedule needs it)."""
    opt = spec.train.optimizer
    if opt is None:
        return [], None
    diags = known_call(opt, OPTIMIZERS, "MSL504", "optimizer")
    if diags and opt.name not in OPTIMIZERS:
        return diags, None
    args = numeric_args(opt, OPTIMIZERS)
    for arg, value in args.items():
        test, rule = ADAMW_RANGES[arg]
        if not test(value):
            diags.append(
                error(
                    "MSL505",
                    f"{arg} = {fmt_num(value)} is out of range: {arg} must be {rule}",
                    opt.arg_spans.get(arg, opt.span),
                    range_hint(arg),
                )
            )
    lr = args.get("lr")
    return diags, (lr if lr is not None and lr > 0 else None)


def range_hint(arg: str) -> str | None:
    return {
        "lr": "a typical peak learning rate is 1e-4 to 1e-3",
        "beta1": "AdamW's beta1 is usually 0.9",
        "beta2": "AdamW's beta2 is usually 0.95 or 0.999",
        "eps": "AdamW's eps is usually 1e-8",
        "weight_decay": "weight_decay is usually 0.1, or 0 for none",
    }.get(arg)


def is_whole(v) -> bool:
    return isinstance(v, int) or (isinstance(v, float) and v.is_integer())


def check_schedule(spec: Spec, lr: float | None) -> list[Diagnostic]:
    sched = spec.train.schedule
    if sched is None:
        return []
    diags = known_call(sched, SCHEDULES, "MSL506", "learning-rate schedule")
    if sched.name not in SCHEDULES:
        return diags
    args = numeric_args(sched, SCHEDULES)

    def span(arg):
        return sched.arg_spans.get(arg, sched.span)

    ok = {}
    for arg in ("warmup", "steps"):
        if arg not in args:
            continue
        v = args[arg]
        least = 0 if arg == "warmup" else 1
        if not is_whole(v) or v < least:
            rule = "a whole number of steps" + (" >= 0" if arg == "warmup" else " > 0")
            diags.append(
                error("MSL505", f"{arg} = {fmt_num(v)} is out of range: {arg} must be {rule}",
                      span(arg))
            )  # fmt: skip
        else:
            ok[arg] = int(v)
    if "warmup" in ok and "steps" in ok and ok["warmup"] >= ok["steps"]:
        diags.append(
            error(
                "MSL502",
                f"warmup = {ok['warmup']} is not shorter than the schedule's steps = "
                f"{ok['steps']}",
                span("warmup"),
                "the warmup must end before the last step: lower warmup (a few percent of "
                "steps is usual) or raise steps",
            )
        )
    if "min_lr" in args:
        v = args["min_lr"]
        if v < 0:
            diags.append(
                error("MSL505", f"min_lr = {fmt_num(v)} is out of range: min_lr must be >= 0",
                      span("min_lr"))
            )  # fmt: skip
        elif lr is not None and v > lr:
            diags.append(
                error(
                    "MSL505",
                    f"min_lr = {fmt_num(v)} is above the optimizer's lr = {fmt_num(lr)}",
                    span("min_lr"),
                    "the cosine decays from lr down to min_lr; min_lr is usually lr / 10",
                )
            )
    return diags


# other settings ---------------------------------------------------------------


def check_settings(spec: Spec) -> list[Diagnostic]:
    train = spec.train
    diags = []

    def span(key):
        return train.spans.get(key, train.span)

    if train.zero not in ZERO_LEVELS:
        diags.append(
            error(
                "MSL503",
                f"zero = {train.zero} is not a ZeRO level",
                span("zero"),
                "zero is MindSpore's parallel optimizer level: 0 (off), 1, 2 or 3",
            )
        )
    if train.loss_scale not in (None, *LossScale):
        try:
            scale = float(train.loss_scale)
        except ValueError:
            scale = -1.0
        if not scale > 0:
            diags.append(
                error(
                    "MSL512",
                    f"loss_scale = {train.loss_scale} must be a positive number",
                    span("loss_scale"),
                    "use `dynamic`, `none`, or a fixed scale such as 1024",
                )
            )
    if train.grad_clip is not None and not train.grad_clip > 0:
        diags.append(
            error(
                "MSL512",
                f"grad_clip = {fmt_num(train.grad_clip)} must be positive",
                span("grad_clip"),
                "clip the global gradient norm at a positive value (1.0 is usual), or write "
                "`grad_clip = none`",
            )
        )
    if train.eval_every is not None and train.valid is None:
        diags.append(
            error(
                "MSL513",
                "eval_every is set but the data names no validation set",
                span("eval_every"),
                'name one: `data = mindrecord("train.mindrecord", valid = "valid.mindrecord")`, '
                "or remove eval_every",
            )
        )
    if not 0 <= train.seed < SEED_LIMIT:
        diags.append(
            error(
                "MSL505",
                f"seed = {train.seed} is out of range: a seed is in 0 .. 2^32 - 1",
                span("seed"),
            )
        )
    return diags


def run(spec: Spec, facts: Facts) -> list[Diagnostic]:
    opt_diags, lr = check_optimizer(spec)
    return (
        check_batch(spec)
        + opt_diags
        + check_schedule(spec, lr)
        + check_settings(spec)
        + check_buckets(spec)
        + check_patterns(spec, facts)
        + check_fusion_kinds(spec)
        + check_evaluation(spec)
    )
