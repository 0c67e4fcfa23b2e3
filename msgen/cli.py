"""The `msgen` command: declare the arguments, route a command line to its handler
(msgen.commands.handlers), turn every failure into one line and an exit status.

Exit codes (msgen.base.status): 0 fine (warnings allowed), 1 the spec has
errors, 2 usage error, 3 stale (`--check`), 70 internal error.
"""

from __future__ import annotations

import argparse
import os
import sys

from msgen.base.status import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_PIPE,
    EXIT_USAGE,
    UsageError,
)
from msgen.commands.handlers import (
    cmd_calibrate,
    cmd_check,
    cmd_ckpt,
    cmd_compile,
    cmd_data,
    cmd_diff,
    cmd_doctor,
    cmd_estimate,
    cmd_explain,
    cmd_fmt,
    cmd_import,
    cmd_plan,
    cmd_report,
)


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


def add_calibration_option(p) -> None:
    p.add_argument("--calibration", metavar="FILE",
                   help="time on the spec's device as `msgen calibrate` fitted it to your "
                   "runs (the built-in catalogue stays as it is)")  # fmt: skip


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
    p.add_argument("--resume", action="store_true",
                   help="go on from the units a killed or failed run into DIR finished")  # fmt: skip
    p.add_argument("--workers", type=int, default=0, metavar="N",
                   help="worker processes, a core each (default: the machine's cores)")  # fmt: skip
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: worker processes on this machine; ray: Ray workers "
                   "(pip install 'msgen[ray]')")  # fmt: skip
    p.add_argument("--ray-address", metavar="ADDR",
                   help="the Ray cluster to join (default: start a Ray on this machine)")  # fmt: skip
    p.add_argument("--unit-size", default="64M", metavar="SIZE",
                   help="input per work unit: large files are split into units of this size "
                   "(default: 64M)")  # fmt: skip
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
