"""The one mutation fuzzer: tests/test_fuzz.py runs a bounded number of cases,
bench/bench_fuzz.py a campaign, tests/test_properties.py drives `mutate` from
hypothesis.

A case is a shipped spec, mutated, through one command in-process, or the spec as
shipped through `estimate` with random `--set` what-ifs over every mesh and batch
key. Mutations are mostly statement-level (a statement's value swapped for another
of its kind: a number, a name, a string; a statement deleted, duplicated or moved
within its block), so most cases get past the parser and reach the checks, the
estimate and code generation; the rest are token-level (tokens deleted,
duplicated, swapped, replaced) and hostile text (control characters, deep nesting,
long and zero-padded numbers).

The oracle (`failures`): the case ends within TIME_LIMIT seconds; with an exit
status the README documents for it (0, 1, 2, 3), never 70 or a traceback; what
`compile` writes is Python that compiles and shell that `bash -n` accepts; and
`fmt`'s output, when the input parses, gets the same diagnostics as the input.
"""

from __future__ import annotations

import contextlib
import functools
import io
import py_compile
import random
import re
import signal
import subprocess
import tempfile
from pathlib import Path

from msgen.analysis.plan import Plan
from msgen.cli import EXIT_INTERNAL, main
from msgen.compiler import analyze_text
from msgen.syntax.fmt import format_text

ROOT = Path(__file__).resolve().parents[1]
SPECS = {p.name: p.read_text() for p in sorted((ROOT / "specs").glob("*.msl"))}
SPECS["base.msl"] = (ROOT / "tests" / "cases" / "base.msl").read_text()

TOKEN = re.compile(
    r'"[^"\n]*"|#[^\n]*|[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?[A-Za-z_0-9]*'
    r"|//|\n|[ \t]+|."
)
# Long and zero-padded numbers: 4,300 digits is Python's int_max_str_digits.
LONG_NUMBERS = ["0" * 4400 + "8", "0" * 5000 + "1", "9" * 5000, "0" * 4301, "1" + "0" * 400,
                "0" * 300 + "2.5", "1e" + "0" * 4400 + "3"]  # fmt: skip
NUMBERS = ["0", "1", "-1", "2", "3", "7", "1000000", "1099511627776", "0.5", "1e-9", "1e300",
           "99999999999999999999999", "64", "3e-4", "-0.0", "1e400", "1e308 * 10", "9" * 5000,
           "2 ** 3", "1 / 0", "0 // 0", "008", *LONG_NUMBERS]  # fmt: skip
HOSTILE = ["\r", "\x1b[31m", "\x00", "\u2028", "\ufeff", "\t", "\\\n", '"', "#", "é", "\x0c",
           "(" * 300, "[" * 300, "-" * 300, " + 0" * 300, "f(" * 300, ")" * 50, "]" * 50,
           "{", "}", "@", "repeat", "input", "output", "hccn(\"/dev/zero\")",
           'hccn("/etc/passwd")', "parameter", "tensor", "_x", "class"]  # fmt: skip
# statement-level kinds keep the syntax; token-level ones mostly break it
KINDS = ("value", "line", "delete", "duplicate", "swap", "replace", "hostile")
WEIGHTS = (10, 4, 1, 1, 1, 1, 1)
COMMANDS = ("check", "estimate", "fmt", "compile", "set")
# Every mesh and batch key, and the values a what-if gives them: mostly ones a user
# would try, some hostile.
WHATIF_KEYS = ["mesh.dp", "mesh.tp", "mesh.pp", "train.micro_batch", "train.global_batch",
               "pipeline.micro_batches", "train.zero"]  # fmt: skip
WHATIF_VALUES = ["1", "2", "3", "4", "8", "16", "32", "64", "128", "1024", "0", "-1", "7",
                 "1099511627775", "2.0", *LONG_NUMBERS]  # fmt: skip
OTHER_SET = ["model.hidden", "model.layers", "train.optimizer", "train.grad_clip",
             "budget.device_memory", "cluster.nodes", "model.nope", "nope.x", "model", ".="]  # fmt: skip
TIME_LIMIT = 60  # seconds per case: far above any spec here (a case takes well under 1 s)
DOCUMENTED = {"check": {0, 1, 2}, "estimate": {0, 1, 2}, "fmt": {0, 1, 2, 3},
              "compile": {0, 1, 2, 3}, "import": {0, 1, 2}, "ckpt": {0, 1, 2},
              "report": {0, 1, 2}, "calibrate": {0, 1, 2}}  # fmt: skip


def statement_lines(toks: list[str]) -> list[tuple[int, int]]:
    """(first, end) token ranges of the lines that are `name = ...` statements."""
    out, start = [], 0
    for i, t in enumerate(toks + ["\n"]):
        if t == "\n":
            line = [x for x in toks[start:i] if not x.isspace()]
            if len(line) >= 3 and line[1] == "=" and line[0][:1].isalpha():
                out.append((start, i))
            start = i + 1
    return out


def values(toks: list[str]) -> list[int]:
    """Indices of the tokens right of a statement's `=`: numbers, names, strings."""
    out = []
    for first, end in statement_lines(toks):
        at = toks.index("=", first, end)
        out += [i for i in range(at + 1, end) if toks[i][:1].isalnum() or toks[i][:1] in '"_']
    return out


def kind_of(t: str) -> str:
    return "number" if t[:1].isdigit() else "string" if t[:1] == '"' else "name"


def new_value(old: str, pool: list[str], rnd: random.Random) -> str:
    """Another value of the kind of `old`: one the spec uses, a number halved or
    doubled, or (a number, rarely) one of NUMBERS."""
    if kind_of(old) == "number":
        roll = rnd.random()
        if roll < 0.3 and old.isdigit():
            return str(max(1, int(old) * 2 if rnd.random() < 0.5 else int(old) // 2))
        if roll < 0.6:
            return rnd.choice(NUMBERS)
    same = [t for t in pool if kind_of(t) == kind_of(old)]
    return rnd.choice(same or [old])


def mutate(text: str, rnd: random.Random) -> str:
    """One to three edits of `text`, mostly ones that keep it parsing."""
    toks = TOKEN.findall(text)
    for _ in range(rnd.choices((1, 2, 3), (6, 3, 1))[0]):
        solid = [i for i, t in enumerate(toks) if t and not t.isspace()]
        kind = rnd.choices(KINDS, WEIGHTS)[0]
        i = rnd.choice(solid)
        if kind == "value":
            spots = values(toks)
            i = rnd.choice(spots)
            toks[i] = new_value(toks[i], [toks[j] for j in spots], rnd)
        elif kind == "line":
            lines = statement_lines(toks)
            first, end = rnd.choice(lines)
            how = rnd.choice(("delete", "duplicate", "move"))
            line = toks[first:end]
            if how == "delete":
                toks[first:end] = [""] * (end - first)
            elif how == "duplicate":
                toks[end:end] = ["\n", *line]
            else:
                other, _ = rnd.choice(lines)
                toks[first:end] = [""] * (end - first)
                toks[other:other] = [*line, "\n"]
        elif kind == "delete":
            toks[i] = ""
        elif kind == "duplicate":
            toks[i] = toks[i] + " " + toks[i]
        elif kind == "swap":
            j = rnd.choice(solid)
            toks[i], toks[j] = toks[j], toks[i]
        elif kind == "replace":
            toks[i] = toks[rnd.choice(solid)]
        else:
            toks[i] = rnd.choice((toks[i] + rnd.choice(HOSTILE), rnd.choice(HOSTILE)))
    return "".join(toks)


@functools.cache
def sizes(name: str) -> tuple[int, int, int]:
    """The shipped spec's device count, global batch and repeated layers."""
    result = analyze_text(SPECS[name], name, ROOT / "specs")
    spec = result.spec
    devices = spec.cluster.per_node * len(spec.cluster.nodes)
    return devices, spec.train.global_batch, Plan(spec, result.facts).total_layers


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def whatif_value(rnd: random.Random) -> str:
    """Mostly a power of two up to 128 (a value a user tries: it gets past lowering
    to the checks and the estimate), else one of WHATIF_VALUES."""
    return str(2 ** rnd.randint(0, 7)) if rnd.random() < 0.8 else rnd.choice(WHATIF_VALUES)


def whatifs(name: str, rnd: random.Random) -> list[str]:
    """`--set` flags: a whole other layout of the devices and the batch (dp, tp, pp,
    micro-batch, micro-batches, zero: what a user trying layouts writes), or some
    mesh and batch keys with values from WHATIF_VALUES; now and then another
    key with a hostile value."""
    if rnd.random() < 0.5:
        devices, batch, layers = sizes(name)
        tp = rnd.choice(divisors(devices))
        pp = rnd.choice([p for p in divisors(devices // tp) if p <= layers])
        dp = devices // tp // pp
        per_replica = batch // dp if batch % dp == 0 else 1
        micro = rnd.choice([m for m in divisors(per_replica) if per_replica // m >= pp] or [1])
        chosen = {"mesh.dp": dp, "mesh.tp": tp, "mesh.pp": pp, "train.micro_batch": micro,
                  "pipeline.micro_batches": max(1, batch // (dp * micro)),
                  "train.zero": rnd.choice((0, 1, 2, 3)) if dp > 1 else 0}  # fmt: skip
        flags = [f for key, v in chosen.items() for f in ("--set", f"{key}={v}")]
    else:
        # each key at 40%: two mesh keys together (tp and pp: H10) are common
        keys = [k for k in WHATIF_KEYS if rnd.random() < 0.4] or [rnd.choice(WHATIF_KEYS)]
        flags = [f for key in keys for f in ("--set", f"{key}={whatif_value(rnd)}")]
    if rnd.random() < 0.1:
        value = rnd.choice([*NUMBERS, *HOSTILE, "adamw(lr = 1e999)", "[" * 3000])
        flags += ["--set", f"{rnd.choice(OTHER_SET)}={value}"]
    return flags


def case(rnd: random.Random) -> tuple[str, str, list[str]]:
    """(spec name, spec text, command) for one fuzz case."""
    name = rnd.choice(sorted(SPECS))
    command = rnd.choice(COMMANDS)
    if command == "set":
        what = rnd.choice((["estimate"], ["compile", "-o", "out"]))
        return name, SPECS[name], [*what, *whatifs(name, rnd)]
    text = mutate(SPECS[name], rnd)
    if command == "fmt":
        return name, text, ["fmt", "--check"]
    if command == "compile":
        return name, text, ["compile", "-o", "out"]
    return name, text, [command]


class Timeout(BaseException):
    """Past the time limit: a BaseException, so main's catch-all does not take it for
    a crash of msgen's own."""


def _alarm(signum, frame):
    raise Timeout


def _stream(errors: str) -> io.TextIOWrapper:
    """A stand-in for stdout (errors "strict") or stderr ("backslashreplace") that
    encodes as Python's own streams to a UTF-8 pipe do: a lone surrogate that would
    fail on the real stdout fails here too."""
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors=errors, newline="")


def _text(stream: io.TextIOWrapper) -> str:
    stream.flush()
    return stream.buffer.getvalue().decode("utf-8")


def call(argv: list[str], limit: int | None = None) -> tuple[int, str]:
    """msgen's main(argv) in this process, in the current folder: (exit status, stderr);
    status -1 when it ran past `limit` seconds (default TIME_LIMIT). The one runner of
    both campaigns (here and tests/file_mutations.py)."""
    out, err = _stream("strict"), _stream("backslashreplace")
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(limit or TIME_LIMIT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = main(argv)
    except SystemExit as exc:  # argparse's usage errors
        status = exc.code if isinstance(exc.code, int) else 2
    except Timeout:
        status = -1
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return status, _text(err)


def run(name: str, text: str, command: list[str]) -> tuple[int, str, list[str]]:
    """Run one case in a scratch folder (the spec beside a copy of what it reads);
    (exit status, stderr, what is wrong with it: `failures`)."""
    with tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch):
        folder = Path(scratch)
        for conf in (ROOT / "specs").glob("*.conf"):
            (folder / conf.name).write_bytes(conf.read_bytes())
        (folder / name).write_text(text, encoding="utf-8", errors="surrogateescape")
        status, err = call([command[0], name, *command[1:]])
        wrong = failures(command, status, err)
        if status == 0 and command[0] == "compile":
            wrong += generated_faults(folder / "out")
        if status in (0, 3) and command[0] == "fmt":
            wrong += fmt_faults(folder / name)
    return status, err, wrong


def failures(command: list[str], status: int, stderr: str) -> list[str]:
    out = []
    if status == -1:
        out.append(f"took more than {TIME_LIMIT} s")
    elif status == EXIT_INTERNAL or "Traceback" in stderr or "internal error" in stderr:
        out.append("crashed")
    elif status not in DOCUMENTED[command[0]]:
        out.append(f"exit status {status} is not documented for {command[0]}")
    return out


def generated_faults(out: Path) -> list[str]:
    """Each generated Python file compiles; each shell script passes `bash -n`."""
    wrong = []
    for path in sorted(out.rglob("*.py")):
        try:
            py_compile.compile(str(path), cfile=str(path) + "c", doraise=True)
        except py_compile.PyCompileError as exc:
            wrong.append(f"{path.name} does not compile: {exc.msg[-300:]}")
    for path in sorted(out.rglob("*.sh")):
        run = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        if run.returncode:
            wrong.append(f"{path.name} fails bash -n: {run.stderr[-300:]}")
    return wrong


def fmt_faults(path: Path) -> list[str]:
    """fmt's layout of a spec that parses gets the same diagnostics (codes and
    messages; the spans move with the lines)."""
    text = path.read_text(encoding="utf-8", errors="surrogateescape")
    out, _ = format_text(text, path.name)
    if out is None:
        return ["fmt --check passed a spec that does not parse"]

    def said(t: str):
        result = analyze_text(t, path.name, path.parent)
        return sorted((d.code, d.message) for d in result.diagnostics)

    before, after = said(text), said(out)
    return [] if before == after else [f"fmt changes the diagnostics: {before} -> {after}"]


def codes(stderr: str) -> set[str]:
    return set(re.findall(r"\b(MSL\d{3})\b", stderr))


def past_parsing(stderr: str) -> bool:
    """No syntax diagnostic (MSL001..MSL005): the case reached lowering and the checks."""
    return not any(c <= "MSL005" for c in codes(stderr))
