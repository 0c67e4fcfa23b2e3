"""How diagnostics are printed (text, `--error-format json`, `github`) and the exit
codes: 0 fine (warnings allowed), 1 errors, 2 usage, 70 internal error."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from msgen import cli
from msgen.base.render import render, render_github, render_json, render_text
from msgen.diagnostics import Span, error, warning

ROOT = Path(__file__).resolve().parent.parent
CASES = Path(__file__).resolve().parent / "cases"
BAD = "msl201_tp_does_not_divide_heads"  # one error: tp = 8 on line 21
WARNED = "msl112_unused_tensor"  # one warning, exit 0


def msgen(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """The installed `msgen` script, as CI runs it."""
    script = Path(sys.executable).parent / "msgen"
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "msgen.cli"]
    return subprocess.run([*command, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


# exit codes -----------------------------------------------------------------------


def test_clean_spec_exits_0_silently():
    proc = msgen("check", "specs/tiny.msl")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_warnings_alone_exit_0():
    proc = msgen("check", "spec.msl", cwd=CASES / WARNED)
    assert proc.returncode == 0
    assert "warning[MSL112]" in proc.stderr


def test_errors_exit_1():
    proc = msgen("check", "spec.msl", cwd=CASES / BAD)
    assert proc.returncode == 1
    assert proc.stderr.startswith("spec.msl:21:5: error[MSL201]: ")


def test_one_bad_spec_among_several_exits_1(tmp_path):
    good = tmp_path / "good"
    shutil.copytree(CASES / WARNED, good)
    proc = msgen("check", "good/spec.msl", str(CASES / BAD / "spec.msl"), cwd=tmp_path)
    assert proc.returncode == 1
    # each file's diagnostics name that file: inside the current directory relative to
    # it, outside it as given
    bad = CASES / BAD / "spec.msl"
    assert "good/spec.msl:" in proc.stderr and f"\n{bad}:21:5: error[MSL201]" in proc.stderr


def test_missing_file_exits_2():
    proc = msgen("check", "no/such/spec.msl")
    assert proc.returncode == 2
    assert proc.stderr == "msgen: error: no such spec file: no/such/spec.msl\n"


@pytest.mark.parametrize(
    "args",
    [
        ("check", "specs/tiny.msl", "--no-such-flag"),
        ("check", "specs/tiny.msl", "--error-format", "xml"),
        ("check",),
        ("frobnicate",),
        (),
    ],
)
def test_bad_usage_exits_2(args):
    proc = msgen(*args)
    assert proc.returncode == 2
    assert "usage: msgen" in proc.stderr and "Traceback" not in proc.stderr


def test_unreadable_spec_exits_2(tmp_path):
    spec = tmp_path / "spec.msl"
    spec.write_bytes(b"msl 0.1\n\xff\xfe\n")
    proc = msgen("check", "spec.msl", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("msgen: error: cannot read spec.msl")


def test_internal_error_exits_70(monkeypatch, capsys, tmp_path):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr("msgen.compiler.checked", broken)
    monkeypatch.chdir(CASES / WARNED)
    assert cli.main(["check", "spec.msl"]) == 70
    err = capsys.readouterr().err
    assert err.startswith("msgen: internal error: RuntimeError: boom\n")
    assert "This is a bug in msgen" in err


# formats --------------------------------------------------------------------------


def check_in(folder: Path, monkeypatch, capsys, *flags: str) -> tuple[int, str]:
    monkeypatch.chdir(folder)
    code = cli.main(["check", "spec.msl", *flags])
    out, err = capsys.readouterr()
    assert out == ""
    return code, err


def test_text_format_matches_the_design(monkeypatch, capsys):
    code, err = check_in(CASES / BAD, monkeypatch, capsys)
    lines = err.splitlines()
    assert code == 1
    assert lines[0] == "spec.msl:21:5: error[MSL201]: tp = 8 does not divide heads = 4"
    assert lines[1] == "   21 |     tp = 8"
    assert lines[2] == "      |     ^^^^^^"
    assert lines[3].startswith("   = hint: tp must divide heads (4)")


def test_json_format(monkeypatch, capsys):
    code, err = check_in(CASES / BAD, monkeypatch, capsys, "--error-format", "json")
    assert code == 1
    objects = [json.loads(line) for line in err.splitlines()]
    assert len(objects) == 1
    (obj,) = objects
    assert set(obj) >= {"code", "severity", "message", "file", "line", "column", "end"}
    assert obj["code"] == "MSL201"
    assert obj["severity"] == "error"
    assert obj["message"] == "tp = 8 does not divide heads = 4"
    assert (obj["file"], obj["line"], obj["column"]) == ("spec.msl", 21, 5)
    assert obj["end"] == {"line": 21, "column": 11}
    assert obj["hint"].startswith("tp must divide heads")


def test_json_format_one_object_per_diagnostic(monkeypatch, capsys):
    folder = CASES / "msl308_hccn_lists_more_devices"
    code, err = check_in(folder, monkeypatch, capsys, "--error-format", "json")
    objects = [json.loads(line) for line in err.splitlines()]
    assert code == 1
    assert [o["code"] for o in objects] == ["MSL308", "MSL308"]
    assert [o["column"] for o in objects] == [19, 39]


def test_json_warning(monkeypatch, capsys):
    code, err = check_in(CASES / WARNED, monkeypatch, capsys, "--error-format=json")
    (obj,) = [json.loads(line) for line in err.splitlines()]
    assert code == 0
    assert (obj["code"], obj["severity"], obj["line"]) == ("MSL112", "warning", 35)


def test_github_format(monkeypatch, capsys):
    code, err = check_in(CASES / BAD, monkeypatch, capsys, "--error-format", "github")
    assert code == 1
    (line,) = err.splitlines()
    assert line.startswith(
        "::error file=spec.msl,line=21,col=5,endLine=21,endColumn=11,title=MSL201::"
        "tp = 8 does not divide heads = 4 (hint: tp must divide heads (4)"
    )


def test_github_warning(monkeypatch, capsys):
    code, err = check_in(CASES / WARNED, monkeypatch, capsys, "--error-format", "github")
    assert code == 0
    assert err.startswith("::warning file=spec.msl,line=35,col=5,")
    assert ",title=MSL112::`spare` is computed but never used" in err


SPAN = Span(file="a,b:c.msl", line=3, col=2, end_line=3, end_col=5)


def test_github_escapes_newlines_percent_and_properties():
    d = error("MSL401", "100% over", SPAN, "first\nsecond\r")
    line = render_github(d)
    assert "\n" not in line and "\r" not in line
    assert line == (
        "::error file=a%2Cb%3Ac.msl,line=3,col=2,endLine=3,endColumn=5,title=MSL401::"
        "100%25 over (hint: first%0Asecond%0D)"
    )


def test_diagnostic_without_span():
    d = warning("MSL507", "no span here", None)
    assert render_text(d, {}) == "warning[MSL507]: no span here"
    assert json.loads(render_json(d))["line"] is None
    assert render_github(d) == "::warning title=MSL507::no span here"


def test_text_multiline_hint_is_indented():
    d = error("MSL401", "over", SPAN, "one\ntwo")
    text = render_text(d, {SPAN.file: "x\ny\nabcdef\n"})
    assert text.splitlines() == [
        "a,b:c.msl:3:2: error[MSL401]: over",
        "    3 | abcdef",
        "      |  ^^^",
        "   = hint: one",
        "           two",
    ]


def test_text_span_over_several_lines_underlines_to_the_end_of_its_first():
    span = Span(file="f.msl", line=1, col=3, end_line=2, end_col=2)
    text = render_text(error("MSL003", "m", span), {"f.msl": "abcdef\nxyz\n"})
    assert text.splitlines()[2] == "      |   ^^^^"


def test_text_shows_source_lines_only_from_the_span_file():
    d = error("MSL103", "unknown block", Span(file="<--set>", line=2, col=1, end_line=2, end_col=5))
    text = render_text(d, {"spec.msl": "first\nsecond line of the spec\n"})
    assert "second line of the spec" not in text
    assert text.splitlines()[0] == "<--set>:2:1: error[MSL103]: unknown block"


def test_render_joins_lines():
    diags = [error("MSL101", "a", SPAN), warning("MSL112", "b", SPAN)]
    assert render(diags, "json", {}).count("\n") == 2
    assert render(diags, "github", {}).count("\n") == 2
