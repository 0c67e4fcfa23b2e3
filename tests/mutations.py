"""The mutation fuzzer shared by tests/test_fuzz.py (a bounded number of cases per
run) and bench/bench_fuzz.py (a campaign): a shipped spec with tokens deleted,
duplicated, swapped or replaced, numbers changed, and hostile text put in (control
characters, a lone carriage return, deep nesting, huge numbers), run through one
command in-process. A case fails when msgen exits 70 or prints a traceback."""

from __future__ import annotations

import contextlib
import io
import random
import re
import tempfile
from pathlib import Path

from msgen.cli import EXIT_INTERNAL, main

ROOT = Path(__file__).resolve().parents[1]
SPECS = {p.name: p.read_text() for p in sorted((ROOT / "specs").glob("*.msl"))}
SPECS["base.msl"] = (ROOT / "tests" / "cases" / "base.msl").read_text()

TOKEN = re.compile(
    r'"[^"\n]*"|#[^\n]*|[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?[A-Za-z_0-9]*'
    r"|//|\n|[ \t]+|."
)
NUMBERS = ["0", "1", "-1", "2", "3", "7", "1000000", "1099511627776", "0.5", "1e-9", "1e300",
           "99999999999999999999999", "64", "3e-4", "-0.0", "1e400", "1e308 * 10", "9" * 5000,
           "2 ** 3", "1 / 0", "0 // 0"]  # fmt: skip
HOSTILE = ["\r", "\x1b[31m", "\x00", "\u2028", "\ufeff", "\t", "\\\n", '"', "#", "é", "\x0c",
           "(" * 300, "[" * 300, "-" * 300, " + 0" * 300, "f(" * 300, ")" * 50, "]" * 50,
           "{", "}", "@", "repeat", "input", "output", "hccn(\"/dev/zero\")",
           'hccn("/etc/passwd")', "parameter", "tensor", "_x", "class"]  # fmt: skip
KINDS = ("delete", "duplicate", "swap", "replace", "number", "hostile")
WEIGHTS = (1, 1, 1, 2, 5, 2)
COMMANDS = ("check", "estimate", "fmt", "compile", "set")
# What --set gets: a key msgen knows, a value from the mutations.
SET_KEYS = ["model.hidden", "model.layers", "mesh.tp", "mesh.dp", "pipeline.micro_batches",
            "train.optimizer", "train.grad_clip", "budget.device_memory", "cluster.nodes",
            "model.nope", "nope.x", "model", ".="]  # fmt: skip


def mutate(text: str, rnd: random.Random) -> str:
    toks = TOKEN.findall(text)
    solid = [i for i, t in enumerate(toks) if not t.isspace()]
    numbers = [i for i, t in enumerate(toks) if t[:1].isdigit()]
    # mostly one edit, and mostly numbers, so that many cases get past the parser
    for _ in range(rnd.choices((1, 2, 3), (6, 3, 1))[0]):
        i = rnd.choice(solid)
        kind = rnd.choices(KINDS, WEIGHTS)[0]
        if kind == "delete":
            toks[i] = ""
        elif kind == "duplicate":
            toks[i] = toks[i] + " " + toks[i]
        elif kind == "swap":
            j = rnd.choice(solid)
            toks[i], toks[j] = toks[j], toks[i]
        elif kind == "replace":
            toks[i] = toks[rnd.choice(solid)]
        elif kind == "number" and numbers:
            toks[rnd.choice(numbers)] = rnd.choice(NUMBERS)
        else:
            toks[i] = rnd.choice((toks[i] + rnd.choice(HOSTILE), rnd.choice(HOSTILE)))
    return "".join(toks)


def case(rnd: random.Random) -> tuple[str, str, list[str]]:
    """(spec name, mutated text, command) for one fuzz case."""
    name = rnd.choice(sorted(SPECS))
    command = rnd.choice(COMMANDS)
    if command == "set":
        value = rnd.choice([*NUMBERS, *HOSTILE, "adamw(lr = 1e999)", "[" * 3000])
        return name, SPECS[name], ["estimate", "--set", f"{rnd.choice(SET_KEYS)}={value}"]
    text = mutate(SPECS[name], rnd)
    if command == "fmt":
        return name, text, ["fmt", "--check"]
    if command == "compile":
        return name, text, ["compile", "--check", "-o", "out"]
    return name, text, [command]


def run(name: str, text: str, command: list[str]) -> tuple[int, str]:
    """Run one case in a scratch folder (the spec beside a copy of what it reads);
    (exit status, stderr)."""
    err = io.StringIO()
    with tempfile.TemporaryDirectory() as scratch, contextlib.chdir(scratch):
        folder = Path(scratch)
        for conf in (ROOT / "specs").glob("*.conf"):
            (folder / conf.name).write_bytes(conf.read_bytes())
        (folder / name).write_text(text, encoding="utf-8", errors="surrogateescape")
        args = [command[0], name, *command[1:]]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            status = main(args)
    return status, err.getvalue()


def crashed(status: int, stderr: str) -> bool:
    return status == EXIT_INTERNAL or "Traceback" in stderr or "internal error" in stderr
