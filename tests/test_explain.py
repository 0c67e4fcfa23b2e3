"""`msgen explain CODE`, and the catalogue in msgen/codes.py against its users: every
code the source or a golden case shows has an entry, and every entry is used."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from msgen.cli import main
from msgen.codes import CODES, explain

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "msgen"
CASES = Path(__file__).resolve().parent / "cases"
CODE = re.compile(r"MSL\d{3}")


def codes_in_source() -> dict[str, list[str]]:
    """Every `MSLnnn` literal in msgen's own modules (the catalogue excepted), by file."""
    found: dict[str, list[str]] = {}
    for path in sorted(SOURCE.rglob("*.py")):
        if path.name == "codes.py" and path.parent == SOURCE:
            continue
        for code in CODE.findall(path.read_text(encoding="utf-8")):
            found.setdefault(code, []).append(str(path.relative_to(ROOT)))
    return found


def codes_in_cases() -> set[str]:
    return {c for p in CASES.glob("*/stderr.txt") for c in CODE.findall(p.read_text())}


def test_every_code_in_the_source_has_an_entry():
    missing = {c: files for c, files in codes_in_source().items() if c not in CODES}
    assert not missing, f"codes without an `msgen explain` entry: {missing}"


def test_every_code_in_the_cases_has_an_entry():
    assert codes_in_cases() <= set(CODES)


def test_every_entry_is_used():
    used = set(codes_in_source()) | codes_in_cases()
    unused = sorted(set(CODES) - used)
    assert not unused, f"catalogue entries nothing reports: {unused}"


@pytest.mark.parametrize("code", sorted(CODES))
def test_entry_reads_well(code):
    title, body = CODES[code]
    assert re.fullmatch(r"MSL[0-6]\d\d", code)
    assert title and title == title.strip() and not title.endswith(".")
    assert body.endswith(".") and "  " not in body


@pytest.mark.parametrize("code", sorted(CODES))
def test_explain_prints_the_entry(code, capsys):
    assert main(["explain", code]) == 0
    out = capsys.readouterr().out
    title, body = CODES[code]
    assert out == f"{code}: {title}\n\n{body}\n"


def test_explain_is_case_insensitive(capsys):
    assert main(["explain", "msl201"]) == 0
    assert capsys.readouterr().out.startswith("MSL201: ")
    assert explain("msl301") == explain("MSL301")


@pytest.mark.parametrize("code", ["MSL999", "E201", "201", ""])
def test_explain_unknown_code_is_a_usage_error(code, capsys):
    assert main(["explain", code]) == 2
    err = capsys.readouterr().err
    assert err.startswith("msgen: error: no such code") and "Traceback" not in err
