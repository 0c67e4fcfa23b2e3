"""A run defines only the subcommand it runs (msgen.cli.build_parser(command)); what
it parses, prints and refuses is what the parser with every subcommand gives."""

from __future__ import annotations

import argparse
import contextlib
import io

import pytest

from msgen import cli


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def run(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[object, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            result = vars(parser.parse_args(argv))
        except SystemExit as exc:
            result = exc.code
    return result, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("name", list(cli.SUBCOMMANDS))
def test_one_subcommand_parses_as_all_do(name, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    alone, full = cli.build_parser(name), cli.build_parser()
    assert list(subparsers(alone)) == [name]
    assert subparsers(alone)[name].format_help() == subparsers(full)[name].format_help()
    for argv in ([name], [name, "--help"], [name, "specs/tiny.msl"], [name, "a", "--bogus"],
                 [name, "x.msl", "--set", "mesh.tp=2", "-o", "out"]):  # fmt: skip
        assert run(alone, argv) == run(full, argv), argv


def test_the_subcommand_is_the_first_argument_or_none():
    assert cli._command(["check", "specs/gpt7b.msl"]) == "check"
    # anything before the subcommand, or no known one: every subcommand is defined
    for argv in ([], ["--help"], ["--version"], ["-h", "check"], ["chek"], ["-", "check"]):
        assert cli._command(argv) is None, argv
    assert set(subparsers(cli.build_parser(None))) == set(cli.SUBCOMMANDS)
