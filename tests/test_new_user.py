"""Rough edges a new user hits, each pinned by a test: what-ifs as the docs print
them, `--set` typos, budgets the device cannot give, labels of specs with one base
name, the summary `check` prints on a terminal, `explain --list`, `--help`, and
`compile` refusing to overwrite what it should not."""

from __future__ import annotations

import re
from pathlib import Path

from msgen.cli import EXIT_ERRORS, main

ROOT = Path(__file__).resolve().parent.parent
GPT7B = str(ROOT / "specs" / "gpt7b.msl")


def test_a_budget_beyond_the_device_fails_the_estimate_with_both_numbers(capsys):
    # gpt7b's 58 GiB budget on a 32 GiB ascend910a (3 GiB runtime reserve)
    code = main(["estimate", GPT7B, "--set", "cluster.device=ascend910a"])
    err = capsys.readouterr().err
    assert code == EXIT_ERRORS
    assert re.search(
        r"error\[MSL403\]: the budget of 58\.00 GiB .* ascend910a can give: 29\.00 GiB", err
    )


def run_on_a_terminal(args: list[str]) -> tuple[int, str]:
    """`msgen ARGS` with its standard output on a pseudo-terminal, as at a shell."""
    import os
    import pty
    import subprocess
    import sys

    leader, follower = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "msgen.cli", *args],
        cwd=ROOT,
        env=env,
        stdout=follower,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal's other end is closed: everything is read
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    return proc.returncode, out.decode().replace("\r\n", "\n")


def test_check_sums_up_on_a_terminal_and_stays_silent_in_a_pipe(capsys):
    specs = ["specs/gpt7b.msl", "specs/tiny.msl", "specs/llama13b.msl"]
    code, out = run_on_a_terminal(["check", *specs])
    assert (code, out) == (0, "3 specs, no errors\n")
    code, out = run_on_a_terminal(["check", "tests/cases/msl402_little_headroom/spec.msl"])
    assert (code, out) == (0, "1 spec, no errors, 2 warnings\n")
    code, out = run_on_a_terminal(["check", "--error-format", "json", *specs])
    assert (code, out) == (0, "")
    # standard output not a terminal (captured): nothing
    assert main(["check", *(str(ROOT / s) for s in specs)]) == 0
    assert capsys.readouterr().out == ""


def test_explain_lists_every_code():
    from msgen.codes import CODES

    code, out = run_on_a_terminal(["explain", "--list"])
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == list(CODES)
    assert "MSL403  budget beyond the device" in out.splitlines()


def test_every_subcommand_describes_itself_in_its_help(capsys):
    import argparse

    import pytest

    from msgen.cli import build_parser

    (sub,) = (a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) >= {"check", "estimate", "plan", "compile", "fmt", "explain", "data"}
    for name in sub.choices:
        with pytest.raises(SystemExit):
            main([name, "--help"])
        out = capsys.readouterr().out
        usage, description = out.split("\n\n")[:2]
        assert usage.startswith(f"usage: msgen {name}")
        assert description and not description.startswith(("positional", "options")), name
