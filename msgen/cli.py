"""The `msgen` command: parse arguments, call the library, render diagnostics.

Exit codes (msgen.commands.status): 0 fine (warnings allowed), 1 the spec has
errors, 2 usage error, 3 stale (`--check`), 70 internal error.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from functools import cache
from pathlib import Path

from msgen.commands.status import (
    EXIT_ERRORS,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PIPE,
    EXIT_USAGE,
    UsageError,
)


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
        from msgen.commands.report import render, sort_key

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
    from msgen.commands.report import render
    from msgen.data import DataError
    from msgen.data.command import DataOptions, data_command

    result = _analyze(args.file, args.error_format)
    if not result.ok:
        return EXIT_ERRORS
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

    result = _analyze(args.file, args.error_format, args.set)
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


def add_calibration_option(p) -> None:
    p.add_argument("--calibration", metavar="FILE",
                   help="time on the spec's device as `msgen calibrate` fitted it to your "
                   "runs (the built-in catalogue stays as it is)")  # fmt: skip


def _run_tool(command, options) -> int:
    """A run tool (msgen.runs) with the front end that prints a spec's diagnostics."""
    from msgen.runs import RunError

    try:
        return command(options, lambda spec: _analyze(str(spec), "text"))
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


def _spec_command(sub, name, help_text, func, many=False):
    p = sub.add_parser(name, help=help_text, description=help_text)
    if many:
        p.add_argument("files", nargs="+", metavar="SPEC")
    else:
        p.add_argument("file", metavar="SPEC")
    p.add_argument(
        "--error-format",
        choices=("text", "json", "github"),
        default="text",
        help="how diagnostics are printed (default: text)",
    )
    p.set_defaults(func=func)
    return p


def add_set_option(p) -> None:
    """`--set BLOCK.KEY=VALUE`: the one declaration of the what-if every command that
    reads a spec as it will be compiled shares (same name, metavar and help)."""
    p.add_argument("--set", action="append", default=[], metavar="BLOCK.KEY=VALUE",
                   help="change a value of the spec for this run, e.g. --set mesh.tp=4 "
                   "(repeatable)")  # fmt: skip


def _check_command(sub) -> None:
    _spec_command(sub, "check", "report every mistake in specs, without writing anything",
                  cmd_check, many=True)  # fmt: skip


def _estimate_command(sub) -> None:
    p = _spec_command(sub, "estimate", "memory per device per pipeline stage vs the budget",
                      cmd_estimate)  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the estimate as JSON")
    p.add_argument("--svg", metavar="FILE", help="also draw the stages as a stacked-bar SVG")
    add_set_option(p)
    add_calibration_option(p)


def _plan_command(sub) -> None:
    p = _spec_command(sub, "plan", "search the parallel layouts that fit, ranked by predicted speed",
                      cmd_plan)  # fmt: skip
    p.add_argument("--top", type=int, default=5, metavar="K", help="how many plans (default 5)")
    p.add_argument("--json", action="store_true", help="print the search as JSON")
    p.add_argument("--objective", choices=("time", "memory"), default="time",
                   help="rank by predicted step time (default) or by peak memory")  # fmt: skip
    p.add_argument("--write", metavar="FILE",
                   help="save the top plan (or --pick N) as a spec, laid out as msgen fmt does")  # fmt: skip
    p.add_argument("--pick", type=int, metavar="N",
                   help="with --write: the N-th plan (default 1)")  # fmt: skip
    p.add_argument("--force", action="store_true", help="with --write: replace an existing FILE")
    add_set_option(p)
    add_calibration_option(p)


def _compile_command(sub) -> None:
    p = _spec_command(sub, "compile", "generate the MindSpore training tree", cmd_compile)
    p.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="write DIR/<model>/")  # fmt: skip
    p.add_argument("--check", action="store_true",
                   help="write nothing; print a diff and exit 3 if the tree is stale")  # fmt: skip
    p.add_argument("--force", action="store_true",
                   help="overwrite files in the output folder that msgen did not write")  # fmt: skip
    p.add_argument("--rehearsal", action="store_true",
                   help="the smallest dims the mesh allows, for train.py --rehearse on a laptop")  # fmt: skip
    add_set_option(p)


def _data_command(sub) -> None:
    p = _spec_command(sub, "data", "raw text to the tokenized, packed MindRecord train.py reads",
                      cmd_data)  # fmt: skip
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="text (.txt, .md), JSON Lines (.jsonl) or Parquet files, .gz "
                   "allowed, or folders of them")  # fmt: skip
    p.add_argument("-o", "--output", metavar="DIR", help="where to write (default: data/<model>/)")
    p.add_argument("--field", default="text",
                   help="the JSON Lines / Parquet field holding the text (default: text)")  # fmt: skip
    p.add_argument("--paragraphs", action="store_true",
                   help="text files: a document per blank-line-separated block "
                   "(default: a document per file)")  # fmt: skip
    p.add_argument("--normalize", choices=("nfkc", "nfc", "none"), default="nfkc",
                   help="Unicode normalisation (default: nfkc)")  # fmt: skip
    p.add_argument("--tokenizer", metavar="PATH", help="a Hugging Face tokenizer.json")
    p.add_argument("--train-tokenizer", action="store_true",
                   help="train a byte-level BPE of the spec's vocab on the input")  # fmt: skip
    p.add_argument("--eos", metavar="TOKEN",
                   help="the token that ends a document (default: the tokenizer's)")  # fmt: skip
    p.add_argument("--overlap", type=int, default=0, metavar="N",
                   help="tokens each window repeats from the one before (default: 0)")  # fmt: skip
    p.add_argument("--dedup", action="store_true", help="drop exact duplicate documents")
    p.add_argument("--valid", type=float, metavar="FRACTION",
                   help="put this fraction of the documents in valid.mindrecord")  # fmt: skip
    p.add_argument("--force", action="store_true", help="replace a dataset already in DIR")
    p.add_argument("--for", dest="for_dir", metavar="DIR",
                   help="print the data line for a train.py that runs in DIR "
                   "(default: generated/<model>/)")  # fmt: skip


def _doctor_command(sub) -> None:
    p = _spec_command(sub, "doctor", "check this host against the spec before launch "
                      "(exit 1 on any error)", cmd_doctor)  # fmt: skip
    add_set_option(p)
    p.add_argument("--node", type=int, metavar="N",
                   help="the node to check (default: the one whose address is this host's, else 0)")  # fmt: skip
    p.add_argument("--peers", action="store_true",
                   help="also ping the other nodes' device IPs from this node's devices")  # fmt: skip
    p.add_argument("--dryrun", metavar="LOGDIR",
                   help="instead: hold launch/dryrun.sh's logs against the estimate per stage")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.add_argument("--tree", metavar="DIR",
                   help="the compiled tree (default: generated/<model>/)")  # fmt: skip
    p.add_argument("--run-from", metavar="DIR",
                   help="where train.py runs: the spec's data paths resolve there (default: the tree)")  # fmt: skip
    p.add_argument("--output", metavar="DIR",
                   help="train.py's --output folder (default: the tree's output/)")  # fmt: skip
    p.add_argument("--compiled-from", metavar="SHA256",
                   help="check only if the spec hashes to this (the launch scripts pass their "
                   "tree's); otherwise say so and exit 0")  # fmt: skip


def _diff_command(sub) -> None:
    text = "what a change to a spec does: memory, step time, strategies, generated files"
    p = sub.add_parser("diff", help=text, description=text)
    p.add_argument("specs", nargs="+", metavar="SPEC", help="OLD NEW, or one spec with --base")
    p.add_argument("--base", metavar="REF",
                   help="compare SPEC with its version at the git revision REF")  # fmt: skip
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text",
                   help="text (default), markdown (a pull-request comment) or json")  # fmt: skip
    p.add_argument("-o", "--output", dest="to_file", metavar="FILE",
                   help="write to FILE instead of stdout")  # fmt: skip
    add_set_option(p)  # NEW only: what the change would do with this value
    p.set_defaults(func=cmd_diff)


def _import_command(sub) -> None:
    text = "a Hugging Face model's config.json to a spec (LLaMA, Qwen2, Mistral)"
    p = sub.add_parser("import", help=text, description=text)
    p.add_argument("source", choices=("hf",), help="where the model comes from: hf")
    p.add_argument("config", metavar="CONFIG.json", help="the model's config.json")
    p.add_argument("-o", "--output", metavar="SPEC", help="write the spec here (default: print)")
    p.add_argument("--devices", type=int, metavar="N",
                   help="lay the spec out for N devices with the planner (default: one)")  # fmt: skip
    p.add_argument("--device", default="ascend910b", metavar="NAME",
                   help="the device catalogue entry (default: ascend910b)")  # fmt: skip
    p.add_argument("--per-node", type=int, default=8, metavar="N",
                   help="devices per server (default: 8)")  # fmt: skip
    p.add_argument("--seq", type=int, metavar="N",
                   help="sequence length (default: max_position_embeddings, at most 4096)")  # fmt: skip
    p.add_argument("--name", help="the model's name in the spec (default: the config's folder)")
    p.add_argument("--global-batch", type=int, default=64, metavar="N",
                   help="sequences per step (default: 64)")  # fmt: skip
    p.add_argument("--force", action="store_true", help="replace an existing -o file")
    p.set_defaults(func=cmd_import)


def _ckpt_command(sub) -> None:
    text = "checkpoints in and out: Hugging Face safetensors to msgen's and back, merge, reshard"
    p = sub.add_parser("ckpt", help=text, description=text)
    p.add_argument("action", choices=("from-hf", "to-hf", "merge", "reshard"),
                   help="from-hf: a Hugging Face folder to the checkpoint train.py "
                   "--init-from loads; to-hf: a checkpoint back to safetensors; merge: a "
                   "run's per-rank slices into one checkpoint; reshard: a run's slices for "
                   "the mesh --set gives, as a run folder --resume continues")  # fmt: skip
    p.add_argument("file", metavar="SPEC")
    p.add_argument("source", metavar="DIR",
                   help="from-hf: the Hugging Face model folder; to-hf: the folder from-hf "
                   "wrote, or a run's output folder; merge, reshard: a run's output "
                   "folder (its rank_<r> folders)")  # fmt: skip
    p.add_argument("-o", "--output", required=True, metavar="PATH",
                   help="the folder to write (merge: the checkpoint file)")  # fmt: skip
    p.add_argument("--force", action="store_true",
                   help="write into a folder that is not empty, or replace merge's file")  # fmt: skip
    p.add_argument("--from-hf", metavar="DIR",
                   help="to-hf of a run: the folder from-hf wrote for its --init-from "
                   "(its source.json names and types the tensors)")  # fmt: skip
    p.add_argument("--error-format", choices=("text", "json", "github"), default="text",
                   help="how diagnostics are printed (default: text)")  # fmt: skip
    add_set_option(p)
    p.set_defaults(func=cmd_ckpt)


def _fmt_command(sub) -> None:
    text = "rewrite specs in the canonical layout, keeping comments"
    p = sub.add_parser("fmt", help=text, description=text)
    p.add_argument("files", nargs="+", metavar="SPEC")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 3 if a file would change")  # fmt: skip
    p.set_defaults(func=cmd_fmt)


def _explain_command(sub) -> None:
    text = "what an error code means and how to fix it"
    p = sub.add_parser("explain", help=text, description=text)
    p.add_argument("code", metavar="CODE", nargs="?")
    p.add_argument("--list", action="store_true", help="list every code with its title")
    p.set_defaults(func=cmd_explain)


def _report_command(sub) -> None:
    text = "read a training run back: summary, alarms, predicted against measured"
    p = sub.add_parser("report", help=text, description=text + ". Exit 0 healthy, 1 an "
                       "alarm fired, 2 usage.")  # fmt: skip
    p.add_argument("run", metavar="RUN_DIR", help="train.py's --output folder (rank_*/log.csv)")
    p.add_argument("--spec", metavar="SPEC",
                   help="hold the run against this spec's estimate (default: the spec "
                   "run.json names, when it is here)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    drawing = p.add_mutually_exclusive_group()
    drawing.add_argument("--html", metavar="FILE", help="also write the report and its "
                         "plots as one self-contained HTML file")  # fmt: skip
    drawing.add_argument("--svg", metavar="FILE", help="also write the plots as one SVG")
    add_calibration_option(p)
    p.set_defaults(func=cmd_report)


def _calibrate_command(sub) -> None:
    text = "fit the time model's device parameters to the step times of your runs"
    p = sub.add_parser("calibrate", help=text, description=text + ", with the fit the "
                       "device catalogue is calibrated with; the catalogue is not changed")  # fmt: skip
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="train.py's --output folders")
    p.add_argument("--spec", metavar="SPEC",
                   help="the spec every run ran (default: the one each run.json names)")  # fmt: skip
    p.add_argument("--fit", metavar="P,...",
                   help="the parameters to fit (default: matmul_efficiency, memory_efficiency "
                   "and the links the runs use); at most one per run")  # fmt: skip
    p.add_argument("-o", dest="out_file", metavar="FILE",
                   help="write the fitted values to FILE, for --calibration")  # fmt: skip
    p.add_argument("--force", action="store_true", help="replace an existing FILE")
    p.set_defaults(func=cmd_calibrate)


# Each subcommand's definition, in the order `msgen --help` lists them.
SUBCOMMANDS = {
    "check": _check_command,
    "estimate": _estimate_command,
    "plan": _plan_command,
    "compile": _compile_command,
    "data": _data_command,
    "doctor": _doctor_command,
    "diff": _diff_command,
    "import": _import_command,
    "ckpt": _ckpt_command,
    "fmt": _fmt_command,
    "explain": _explain_command,
    "report": _report_command,
    "calibrate": _calibrate_command,
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """msgen's argument parser; given `command`, with only that subcommand defined,
    which is all a run of it reads (argparse takes about 2 ms to define the others)."""
    from msgen import __version__

    parser = argparse.ArgumentParser(
        prog="msgen",
        description="Compile MSL specs to MindSpore pre-training code for Ascend clusters.",
    )
    parser.add_argument("--version", action="version", version=f"msgen {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, define in SUBCOMMANDS.items():
        if command in (None, name):
            define(sub)
    return parser


def _command(argv: list[str]) -> str | None:
    """The subcommand a command line runs when it starts with one (then argparse goes
    straight to it); None otherwise (options first, a mistyped name, `--help`)."""
    return argv[0] if argv and argv[0] in SUBCOMMANDS else None


def _quiet(stream) -> None:
    """Point a stream that can no longer be written (a closed pipe, a full disk) at
    /dev/null, so that nothing fails again when Python flushes it on exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def _say(text: str) -> None:
    """Write to stderr; if stderr itself is gone there is no one left to tell."""
    from msgen.diagnostics import printable

    try:
        sys.stderr.write(printable(text, keep="\n"))
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        _quiet(sys.stderr)


def main(argv: list[str] | None = None) -> int:
    # A closed stdout or stderr (`>&-`) is None in Python: what goes there is dropped.
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))
    try:
        argv = sys.argv[1:] if argv is None else argv
        args = build_parser(_command(argv)).parse_args(argv)
        if getattr(args, "output", None) == "":
            raise UsageError("-o needs a folder (use `-o .` for the current one)")
        status = args.func(args)
        sys.stdout.flush()
        return status
    except UsageError as exc:
        _say(f"msgen: error: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (`msgen ... | head`): not an error
        _quiet(sys.stdout)
        return EXIT_PIPE
    except OSError as exc:  # the disk or the terminal failed, not msgen
        _quiet(sys.stdout)
        where = f"{exc.filename}: " if exc.filename else ""  # which file, not only why
        _say(f"msgen: error: {where}{exc.strerror or exc}\n")
        return EXIT_USAGE
    except Exception as exc:  # a bug: say so plainly, never a bare traceback
        import traceback

        _say(
            f"msgen: internal error: {type(exc).__name__}: {exc}\n"
            "This is a bug in msgen; please report it with the spec and this trace:\n"
            + traceback.format_exc()
        )
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
