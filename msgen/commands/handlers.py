"""What each `msgen` subcommand does with its parsed arguments: read the spec, call
the library, render diagnostics, return the exit status. msgen.cli declares the
arguments and routes a command line here."""

from __future__ import annotations

import gc
import sys
from functools import cache
from pathlib import Path

from msgen.base.status import EXIT_ERRORS, EXIT_OK, UsageError


@cache
def _front_end():
    """`msgen.compiler.analyze`, imported on first use. The import makes what lives as
    long as the process (modules, classes, pydantic validators: some 30,000 objects the
    cyclic collector tracks): the collector pauses while it does, then leaves those
    objects out of every later collection, the one at exit included (gc.freeze).
    That saves about 35 ms of a `msgen check`'s CPU time (bench/bench_cpu.py)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        from msgen.compiler import analyze
    finally:
        if enabled:
            gc.enable()
    gc.freeze()
    return analyze


def _read_spec(path: str):
    analyze = _front_end()
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"no such spec file: {path}")
    return p, analyze


def _report(result, fmt: str) -> None:
    if result.diagnostics:
        from msgen.base.render import render, sort_key

        diags = sorted(result.diagnostics, key=sort_key)
        sys.stderr.write(render(diags, fmt, {result.file: result.text}))
    if result.stopped and fmt == "text":
        sys.stderr.write(f"note: {result.stopped}\n")
    if result.rederived and fmt == "text":
        changes = ", ".join(result.rederived)
        sys.stderr.write(f"note: --set keeps {result.kept}: {changes}\n")


def _analyze(path: str, fmt: str, overrides=(), what_if: bool = False):
    p, analyze = _read_spec(path)
    try:
        result = analyze(p, list(overrides), what_if)
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {exc}") from exc
    _report(result, fmt)
    return result


def cmd_check(args) -> int:
    status = EXIT_OK
    errors = warnings = 0
    for path in args.files:
        result = _analyze(path, args.error_format)
        if not result.ok:
            status = EXIT_ERRORS
        errors += sum(d.is_error for d in result.diagnostics)
        warnings += sum(not d.is_error for d in result.diagnostics)
    # a person at a terminal learns that silence meant success; pipes and JSON Lines
    # readers get only the diagnostics
    if args.error_format == "text" and sys.stdout.isatty():
        sys.stdout.write(check_summary(len(args.files), errors, warnings) + "\n")
    return status


def check_summary(specs: int, errors: int, warnings: int) -> str:
    """`3 specs, no errors`, `1 spec, 2 errors, 1 warning`."""

    def count(n: int, word: str) -> str:
        return f"{n} {word}{'' if n == 1 else 's'}"

    parts = [count(specs, "spec"), count(errors, "error") if errors else "no errors"]
    if warnings:
        parts.append(count(warnings, "warning"))
    return ", ".join(parts)


def cmd_estimate(args) -> int:
    from msgen.commands.estimate import EstimateOptions, estimate_command

    result = _analyze(args.file, args.error_format, args.set, what_if=True)
    options = EstimateOptions(
        Path(args.file), args.json, args.svg, tuple(args.set), _calibrated(args, result)
    )
    return estimate_command(result, options)


def cmd_plan(args) -> int:
    from msgen.commands.plan import PlanOptions, plan_command

    result = _analyze(args.file, args.error_format, args.set, what_if=True)
    write = Path(args.write) if args.write is not None else None
    options = PlanOptions(
        Path(args.file), args.top, args.json, args.objective, write, args.pick, args.force,
        tuple(args.set), _calibrated(args, result),
    )  # fmt: skip
    return plan_command(result, options)


def cmd_compile(args) -> int:
    from msgen.commands.compile import CompileOptions, compile_command

    result = _analyze(args.file, args.error_format, args.set)
    if not result.ok:
        return EXIT_ERRORS
    if args.rehearsal:
        from msgen.commands.rehearsal import rehearsal_sets

        sets, changes = rehearsal_sets(Path(args.file), args.set)
        for change in changes:
            sys.stderr.write(f"rehearsal: {change}\n")
        result = _analyze(args.file, args.error_format, [*args.set, *sets])
    options = CompileOptions(Path(args.file), Path(args.output), args.check, args.force)
    return compile_command(result, options)


def cmd_data(args) -> int:
    from msgen.base.render import render
    from msgen.data import DataError
    from msgen.data.command import DataOptions, data_command

    result = _analyze(args.file, args.error_format)
    if not result.ok:
        return EXIT_ERRORS
    from msgen.data.units import parse_size

    try:
        unit_size = parse_size(args.unit_size)
    except DataError as exc:
        raise UsageError(str(exc)) from exc
    options = DataOptions(
        inputs=tuple(Path(p) for p in args.inputs),
        output=Path(args.output) if args.output else None,
        field=args.field,
        paragraphs=args.paragraphs,
        normalize=args.normalize,
        tokenizer=Path(args.tokenizer) if args.tokenizer else None,
        train_tokenizer=args.train_tokenizer,
        eos=args.eos,
        overlap=args.overlap,
        dedup=args.dedup,
        valid=args.valid,
        force=args.force,
        for_dir=Path(args.for_dir) if args.for_dir else None,
        error_format=args.error_format,
        workers=args.workers,
        engine=args.engine,
        ray_address=args.ray_address,
        resume=args.resume,
        unit_size=unit_size,
    )
    try:
        diags = data_command(result, options)
    except DataError as exc:
        raise UsageError(str(exc) + (f"\n  = hint: {exc.hint}" if exc.hint else "")) from exc
    if diags:
        sys.stderr.write(render(diags, args.error_format, {result.file: result.text}))
        return EXIT_ERRORS
    return EXIT_OK


def cmd_doctor(args) -> int:
    from msgen.doctor.command import DoctorOptions, doctor_command
    from msgen.doctor.compiled import tree_sets

    p, analyze = _read_spec(args.file)
    try:
        result = analyze(p, list(args.set))
        # the launch scripts give the tree, not its flags: the tree's record supplies them
        tree = Path(args.tree) if args.tree else None
        sets = tree_sets(result.spec, tuple(args.set), tree)
        if sets is not None:
            result = analyze(p, list(sets))
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {args.file}: {exc}") from exc
    _report(result, args.error_format)
    paths = {k: Path(v) if v else None for k, v in
             (("dryrun", args.dryrun), ("tree", args.tree), ("run_from", args.run_from),
              ("output", args.output))}  # fmt: skip
    options = DoctorOptions(Path(args.file), args.node, args.peers, json=args.json,
                            compiled_from=args.compiled_from, **paths)  # fmt: skip
    return doctor_command(result, options)


def cmd_diff(args) -> int:
    from msgen.review.command import DiffOptions, diff_command

    if args.base is None and len(args.specs) != 2:
        raise UsageError("diff needs two specs, OLD and NEW, or --base REF and one spec")
    if args.base is not None and len(args.specs) != 1:
        raise UsageError("diff --base REF compares one spec with its version at REF")
    paths = [Path(p) for p in args.specs]
    old = paths[0] if args.base is None else None
    if args.to_file == "":
        raise UsageError("-o needs a file name")
    options = DiffOptions(paths[-1], old, args.base, tuple(args.set), args.format, args.to_file)
    return diff_command(options)


def cmd_import(args) -> int:
    from msgen.hf.command import ImportOptions, import_command

    for flag in ("devices", "per_node", "seq", "global_batch"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be at least 1")
    options = ImportOptions(
        config=Path(args.config),
        output=Path(args.output) if args.output else None,
        devices=args.devices,
        device=args.device,
        per_node=args.per_node,
        seq=args.seq,
        name=args.name,
        global_batch=args.global_batch,
        force=args.force,
    )
    return import_command(options)


def cmd_ckpt(args) -> int:
    from msgen.hf.ckpt import CkptOptions, from_hf, to_hf_command

    result = _analyze(args.file, args.error_format, args.set)
    if not result.ok:
        return EXIT_ERRORS
    if args.action in ("merge", "reshard"):
        from msgen.ckpt.command import TransformOptions, merge_command, reshard_command

        options = TransformOptions(
            Path(args.file), Path(args.source), Path(args.output), args.force
        )
        if args.action == "merge":
            return merge_command(result, options)
        source = _analyze(args.file, args.error_format)  # the run's mesh: the spec as written
        return reshard_command(source, result, options)
    origin = Path(args.from_hf) if args.from_hf else None
    options = CkptOptions(
        Path(args.file), Path(args.source), Path(args.output), args.force, origin=origin
    )
    run = {"from-hf": from_hf, "to-hf": to_hf_command}[args.action]
    return run(result, options)


def cmd_fmt(args) -> int:
    from msgen.commands.fmt import FmtOptions, fmt_command

    return fmt_command(FmtOptions(tuple(args.files), args.check))


def cmd_explain(args) -> int:
    from msgen.codes import explain, listing

    if args.list:
        sys.stdout.write(listing())
        return EXIT_OK
    if args.code is None:
        raise UsageError("explain needs a CODE (such as MSL201), or --list")
    text = explain(args.code)
    if text is None:
        raise UsageError(f"no such code: {args.code} (codes look like MSL201)")
    sys.stdout.write(text)
    return EXIT_OK


def _calibrated(args, result):
    """`--calibration FILE`: the spec's device with the file's values; None without it
    (or when the spec did not lower: its errors are reported as they are)."""
    if not args.calibration or result.spec is None:
        return None
    from msgen.runs import RunError
    from msgen.runs.calibrate import calibrated_device

    try:
        return calibrated_device(Path(args.calibration), result.spec.cluster.device)
    except RunError as exc:
        raise UsageError(str(exc)) from exc


def _run_tool(command, options) -> int:
    """A run tool (msgen.runs) with the front end that prints a spec's diagnostics."""
    from msgen.runs import RunError

    try:
        return command(options, lambda spec, sets=(): _analyze(str(spec), "text", sets))
    except RunError as exc:
        raise UsageError(str(exc)) from exc


def cmd_calibrate(args) -> int:
    from msgen.runs.command import CalibrateOptions, calibrate_command

    fit = tuple(args.fit.split(",")) if args.fit else None
    out = Path(args.out_file) if args.out_file else None
    spec = Path(args.spec) if args.spec else None
    options = CalibrateOptions(tuple(map(Path, args.runs)), spec, fit, out, args.force)
    return _run_tool(calibrate_command, options)


def cmd_report(args) -> int:
    from msgen.runs.command import ReportOptions, report_command

    html, svg, spec, calibration = (
        Path(x) if x else None for x in (args.html, args.svg, args.spec, args.calibration)
    )
    options = ReportOptions(Path(args.run), spec, args.json, html, svg, calibration)
    return _run_tool(report_command, options)
