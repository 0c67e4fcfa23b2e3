"""Golden cases: `tests/cases/<name>/spec.msl` (plus any file it reads) checked with
`msgen check spec.msl` from inside the case folder; the exact stderr and the exit
code are in `stderr.txt` and `exit_code`. `pytest --regen-cases` rewrites them.

A case's name starts with the code of the first error it shows (`msl201_...`); a
case that passes with warnings (exit 0) is named after its first warning.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from msgen.cli import main

CASES = Path(__file__).resolve().parent / "cases"
NAMES = sorted(p.name for p in CASES.iterdir() if (p / "spec.msl").is_file())
HEAD = re.compile(r"^spec\.msl:(\d+):(\d+): (error|warning)\[(MSL\d{3})\]: ", re.MULTILINE)


def run_check(folder: Path, monkeypatch, capsys) -> tuple[int, str, str]:
    """`msgen check spec.msl` in `folder`, in-process (the same `main` the script
    runs; tests/test_report.py runs the installed script itself)."""
    monkeypatch.chdir(folder)
    code = main(["check", "spec.msl"])
    out, err = capsys.readouterr()
    return code, out, err


def first_code(stderr: str, exit_code: int) -> str | None:
    """The code of the first error, or of the first warning when the spec passes."""
    heads = HEAD.findall(stderr)
    wanted = "error" if exit_code else "warning"
    return next((code for _, _, sev, code in heads if sev == wanted), None)


@pytest.mark.parametrize("name", NAMES)
def test_case(name, regen_cases, monkeypatch, capsys):
    folder = CASES / name
    code, out, err = run_check(folder, monkeypatch, capsys)
    assert "Traceback" not in err and "internal error" not in err, err
    assert code in (0, 1), err
    assert out == ""
    if regen_cases:
        (folder / "stderr.txt").write_text(err)
        (folder / "exit_code").write_text(f"{code}\n")
    assert err == (folder / "stderr.txt").read_text()
    assert code == int((folder / "exit_code").read_text())


@pytest.mark.parametrize("name", NAMES)
def test_case_is_named_after_its_first_code(name):
    folder = CASES / name
    stderr = (folder / "stderr.txt").read_text()
    exit_code = int((folder / "exit_code").read_text())
    assert exit_code in (0, 1)
    code = first_code(stderr, exit_code)
    assert code is not None, f"{name}: no diagnostic in stderr.txt"
    assert name.startswith(code.lower() + "_"), f"{name} shows {code} first"


@pytest.mark.parametrize("name", NAMES)
def test_case_points_into_the_spec(name):
    """Every diagnostic names a line and column inside spec.msl, shows that line
    and puts a caret under it."""
    folder = CASES / name
    lines = (folder / "spec.msl").read_text().splitlines()
    stderr = (folder / "stderr.txt").read_text()
    heads = list(HEAD.finditer(stderr))
    assert heads
    for m in heads:
        line, col = int(m.group(1)), int(m.group(2))
        assert 1 <= line <= len(lines)
        assert 1 <= col <= len(lines[line - 1]) + 1
        after = stderr[m.end() :].splitlines()
        assert after[1] == f"{line:>5} | {lines[line - 1]}"
        assert re.fullmatch(r" {5} \| {%d}\^+" % col, after[2])  # "| " then col - 1 blanks


def test_enough_cases():
    invalid = [n for n in NAMES if (CASES / n / "exit_code").read_text().strip() == "1"]
    warned = [n for n in NAMES if (CASES / n / "exit_code").read_text().strip() == "0"]
    assert len(invalid) >= 55
    assert {n[:6] for n in warned} >= {"msl112", "msl208", "msl507"}
