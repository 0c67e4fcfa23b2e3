"""`msgen plan --write` saves a spec that checks where it is written: the paths it
reads rebased, its edits at the lexer's line ends (as `fmt --check`'s diff numbers
lines), the `--set` values with the plan's, never a spec that fails to parse."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest

from msgen.base.status import EXIT_ERRORS, EXIT_USAGE
from msgen.cli import main

ROOT = Path(__file__).resolve().parent.parent
GPT7B = ROOT / "specs" / "gpt7b.msl"
TINY = ROOT / "specs" / "tiny.msl"


def run(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def plan_json(*argv) -> dict:
    code, out, err = run("plan", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def values(plan: dict) -> dict[str, str]:
    return dict(s.split("=", 1) for s in plan["set"])


# item 2: --write rebases the paths the spec reads -----------------------------------


def test_write_into_another_folder_keeps_the_spec_reading_its_files(tmp_path):
    """The README's own `plan --write` into another folder: hccn(...) is relative to
    the spec, so it is rebased; the data paths are relative to where train.py runs
    (generated/<model>/), so they stay as written; an absolute path stays."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b" / "c").mkdir(parents=True)
    shutil.copy(ROOT / "specs" / "hccn.conf", tmp_path / "a" / "hccn.conf")
    absolute = tmp_path / "abs.conf"
    shutil.copy(ROOT / "specs" / "hccn.conf", absolute)
    text = GPT7B.read_text(encoding="utf-8")
    spec = tmp_path / "a" / "gpt7b.msl"
    spec.write_text(text, encoding="utf-8")
    out = tmp_path / "b" / "c" / "planned.msl"
    code, _, err = run("plan", spec, "--top", "1", "--write", out)
    assert code == 0, err
    written = out.read_text(encoding="utf-8")
    assert 'hccn("../../a/hccn.conf")' in written
    assert 'mindrecord("data/train.mindrecord")' in written  # as in specs/gpt7b.msl
    for command in ("check", "estimate"):
        code, _, err = run(command, out)
        assert code == 0 and "MSL309" not in err, err
    assert run("compile", out, "-o", tmp_path / "gen")[0] == 0
    # several nodes, one of them absolute
    two = text.replace('nodes      = ["192.168.1.10"]', 'nodes = ["192.168.1.10", "192.168.1.11"]')
    two = two.replace('hccn("hccn.conf")', f'[hccn("hccn.conf"), hccn("{absolute.as_posix()}")]')
    two = two.replace("dp = 4 ", "dp = 8 ").replace("micro_batches = 64", "micro_batches = 32")
    (tmp_path / "a" / "abs.conf").write_text(
        "".join(f"address_{d}=10.1.0.{d + 1}\n" for d in range(8))
    )
    two = two.replace(f'hccn("{absolute.as_posix()}")', 'hccn("abs.conf")')
    spec.write_text(two, encoding="utf-8")
    code, _, err = run("plan", spec, "--top", "1", "--write", out, "--force")
    assert code == 0, err
    written = out.read_text(encoding="utf-8")
    assert '[hccn("../../a/hccn.conf"), hccn("../../a/abs.conf")]' in written
    assert run("check", out)[0] == 0


def test_an_absolute_path_is_left_as_written():
    from msgen.syntax.edit import rebased, write_settings

    text = 'cluster {\n    device_ips = [hccn("/etc/hccn.conf"), hccn("x.conf")]\n}\n'
    move = rebased(Path("/srv/specs"), Path("/srv/out"))
    out = write_settings(text, [], "<spec>", move)
    assert (
        out == 'cluster {\n    device_ips = [hccn("/etc/hccn.conf"), hccn("../specs/x.conf")]\n}\n'
    )


# issue 22 H11: offsets as the lexer counts lines --------------------------------------

BREAKS = ["\u2028", "\x85", "\x0c", "\u2029", "\x1c", "\x0b"]


@pytest.mark.parametrize("char", BREAKS, ids=[f"U+{ord(c):04X}" for c in BREAKS])
def test_write_edits_land_where_the_parser_put_the_values(char, tmp_path):
    """str.splitlines breaks at each of these, the MSL lexer at none (in a comment):
    the edits must still replace exactly the values, so the written spec estimates as
    the plan says."""
    from msgen.syntax.edit import write_settings
    from msgen.syntax.parser import parse

    text = TINY.read_text(encoding="utf-8")
    text = text.replace("mesh {", f"# a comment with {char} in it\nmesh {{", 1)
    module, diags = parse(text, "t")
    assert module is not None, diags
    out = write_settings(text, ["mesh.dp=4", "mesh.tp=1", "train.zero=2", "budget.x=1"])
    edited, _ = parse(out, "t")
    assert edited is not None
    assigned = {
        f"{b.kind.name}.{s.target.name}": out_text(out, s.value.span)
        for b in edited.blocks
        for s in b.stmts
        if hasattr(s, "target") and hasattr(s, "value")
    }
    assert (assigned["mesh.dp"], assigned["mesh.tp"], assigned["train.zero"]) == ("4", "1", "2")
    assert char in out and out.count("\n") == text.count("\n") + 4  # the new block only
    # through the command: the written spec estimates as the plan it holds
    spec = tmp_path / "t.msl"
    spec.write_text(text, encoding="utf-8")
    shutil.copy(ROOT / "specs" / "hccn.conf", tmp_path)
    doc = plan_json(spec, "--top", "1")
    code, _, err = run("plan", spec, "--top", "1", "--write", tmp_path / "w.msl")
    assert code == 0, err
    code, out_json, err = run("estimate", tmp_path / "w.msl", "--json")
    assert code == 0, err
    assert json.loads(out_json)["time"]["step_s"] == doc["plans"][0]["step_s"]


def out_text(text: str, span) -> str:
    """The text a span covers, found by walking lines as `\\n` ends them."""
    lines = text.split("\n")
    if span.line == span.end_line:
        return lines[span.line - 1][span.col - 1 : span.end_col - 1]
    raise AssertionError("a value on one line")


def test_hccn_conf_lines_end_at_newline_alone(tmp_path):
    """A U+2028 inside an hccn.conf line does not split it into two entries (a reader
    of /etc/hccn.conf by lines sees one), and a non-ASCII digit is no device number."""
    text = TINY.read_text(encoding="utf-8")
    spec = tmp_path / "t.msl"
    spec.write_text(text, encoding="utf-8")
    good = [f"address_{d}=10.0.0.{d + 1}" for d in range(8)]
    (tmp_path / "hccn.conf").write_text("\n".join(good) + "\n", encoding="utf-8")
    assert run("check", spec)[0] == 0
    joined = good[:2] + [good[2] + "\u2028" + good[3]] + good[4:]
    (tmp_path / "hccn.conf").write_text("\n".join(joined) + "\n", encoding="utf-8")
    code, _, err = run("check", spec)
    assert code == EXIT_ERRORS and "Traceback" not in err
    assert "error[MSL30" in err  # not the 8 addresses splitlines would find
    digit = good[:3] + ["address_\u0663=10.0.0.4"] + good[4:]
    (tmp_path / "hccn.conf").write_text("\n".join(digit) + "\n", encoding="utf-8")
    code, _, err = run("check", spec)
    assert code == EXIT_ERRORS and "error[MSL309]" in err


@pytest.mark.parametrize("char", BREAKS[:3], ids=[f"U+{ord(c):04X}" for c in BREAKS[:3]])
def test_fmt_check_numbers_its_diff_as_diagnostics_number_lines(char, tmp_path):
    """The same class in `fmt --check`: the diff's hunk says the line the parser says."""
    from msgen.syntax.parser import parse

    text = TINY.read_text(encoding="utf-8").replace("msl 0.1\n", f"msl 0.1\n# a{char}b\n", 1)
    text = text.replace("    dp = 2\n", "    dp =    2\n", 1)  # fmt puts it back
    spec = tmp_path / "t.msl"
    spec.write_text(text, encoding="utf-8")
    shutil.copy(ROOT / "specs" / "hccn.conf", tmp_path)
    module, _ = parse(text, "t")
    (mesh,) = [b for b in module.blocks if b.kind.name == "mesh"]
    line = mesh.stmts[0].span.line
    code, out, _ = run("fmt", "--check", spec)
    assert code == 3
    removed = [d for d in out.splitlines() if d.startswith("-    dp")]
    assert removed == ["-    dp =    2"]
    at = None  # the old file's line number, walking the hunks
    for d in out.split("\n"):
        if d.startswith("@@"):
            at = int(d.split()[1][1:].split(",")[0])
        elif d.startswith("-    dp"):
            assert at == line
            break
        elif d.startswith((" ", "-")) and not d.startswith("---"):
            at += 1
    else:
        raise AssertionError("no removed dp line in the diff")


def test_a_spec_that_would_not_parse_is_never_written(tmp_path, monkeypatch):
    """Had an edit still landed wrong, --write would have saved whatever came out; the
    edited text is parsed first and nothing is written when it does not parse."""
    import msgen.commands.plan as plan_command

    real = plan_command.write_settings

    def off_by_one(text, settings, file, move):  # an edit at a wrong offset
        return real(text, settings, file, move).replace("mesh {", "mesh {{", 1)

    monkeypatch.setattr(plan_command, "write_settings", off_by_one)
    out = tmp_path / "w.msl"
    code, _, err = run("plan", TINY, "--top", "1", "--write", out)
    assert code == EXIT_USAGE and "the spec with the plan's settings is wrong" in err
    assert "Traceback" not in err and not out.exists()


def test_write_saves_the_set_values_with_the_plan(tmp_path):
    """`plan --set model.seq=64 --set mesh.tp=1 --write F`: F holds both, and estimates as
    the plan that was printed."""
    from msgen.compiler import analyze

    doc = plan_json(TINY, "--top", "1", "--set", "model.seq=64", "--set", "mesh.tp=1")
    (top,) = doc["plans"]
    assert top["set"][0] == "model.seq=64" and values(top)["mesh.tp"] == "1"
    out = tmp_path / "w.msl"
    argv = ["plan", TINY, "--top", "1", "--set", "model.seq=64", "--set", "mesh.tp=1"]
    code, _, err = run(*argv, "--write", out)
    assert code == 0, err
    written = analyze(out)
    assert written.ok and written.spec.model.dims["seq"] == 64 and written.spec.mesh.tp == 1
    code, est, err = run("estimate", out, "--json")
    assert code == 0 and json.loads(est)["time"]["step_s"] == top["step_s"]
