"""`msgen fmt`: idempotent, meaning-preserving, comment-preserving, and the CLI contract."""

from __future__ import annotations

import functools
import random
import re
from pathlib import Path

import pytest

from msgen.cli import main
from msgen.compiler import analyze_text
from msgen.syntax import parse
from msgen.syntax.fmt import format_text

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "tests" / "fmt_cases"


def _specs() -> list[Path]:
    # Globbed when the tests are collected: the error cases in tests/cases grow.
    found = list((ROOT / "specs").rglob("*.msl")) + list(
        (ROOT / "tests" / "cases").rglob("spec.msl")
    )
    found += list(CASES.rglob("*.msl"))
    return sorted(found)


SPECS = _specs()
IDS = [p.relative_to(ROOT).as_posix() for p in SPECS]


@functools.cache
def _format_once(path: Path) -> tuple[str, str | None]:
    # Three tests per spec share one run: parsing is most of the suite's time.
    text = path.read_text(encoding="utf-8")
    if parse(text, str(path))[0] is None:
        return text, None
    out, diags = format_text(text, str(path))
    assert out is not None, diags
    return text, out


def _formatted(path: Path) -> tuple[str, str]:
    text, out = _format_once(path)
    if out is None:
        pytest.skip("does not parse (a syntax-error case)")
    return text, out


def _strip_spans(obj):
    """IR as plain data without source positions and without the spec text's hash."""
    if isinstance(obj, dict):
        return {
            k: _strip_spans(v)
            for k, v in obj.items()
            if not (k in ("span", "spans", "sha256") or k.endswith(("_span", "_spans")))
        }
    if isinstance(obj, list | tuple):
        return [_strip_spans(x) for x in obj]
    return obj


def _comment_texts(text: str) -> list[str]:
    module, _ = parse(text)
    return [t.rstrip() for _, t in module.comments]


@pytest.mark.parametrize("path", SPECS, ids=IDS)
def test_idempotent(path):
    _, out = _formatted(path)
    again, _ = format_text(out, str(path))
    assert again == out


def same_diagnostics(after, before) -> bool:
    """The same codes and messages; not spans, as fmt moves lines."""

    def said(result):
        return sorted((d.code, d.message) for d in result.diagnostics)

    return said(after) == said(before)


@pytest.mark.parametrize("path", SPECS, ids=IDS)
def test_same_ir(path):
    text, out = _formatted(path)
    before = analyze_text(text, str(path), path.parent)
    after = analyze_text(out, str(path), path.parent)
    if before.spec is None:  # a spec that does not lower: the same diagnostics, said alike
        assert after.spec is None
        assert same_diagnostics(after, before)
        return
    assert after.spec is not None, after.diagnostics
    assert _strip_spans(after.spec.model_dump()) == _strip_spans(before.spec.model_dump())
    # The checks see the same spec, so they say the same things.
    assert sorted(d.code for d in after.diagnostics) == sorted(d.code for d in before.diagnostics)


@pytest.mark.parametrize("path", SPECS, ids=IDS)
def test_comments_kept(path):
    text, out = _formatted(path)
    assert _comment_texts(out) == _comment_texts(text)


def test_design_example_is_a_fixed_point():
    text = (ROOT / "specs" / "gpt7b.msl").read_text(encoding="utf-8")
    out, _ = format_text(text)
    assert out == text


@pytest.mark.parametrize("name", sorted(p.name for p in CASES.iterdir() if p.is_dir()))
def test_fixture(name):
    source = (CASES / name / "input.msl").read_text(encoding="utf-8")
    expected = (CASES / name / "expected.msl").read_text(encoding="utf-8")
    out, diags = format_text(source)
    assert out == expected, diags
    assert format_text(expected)[0] == expected


@pytest.mark.parametrize(
    "source, expected",
    [
        ("(heads+2*kv_heads)*head_dim", "(heads + 2 * kv_heads) * head_dim"),
        ("heads+(2*kv_heads)", "heads + 2 * kv_heads"),
        ("(a+b)+c", "a + b + c"),
        ("a+(b+c)", "a + (b + c)"),
        ("a-(b-c)", "a - (b - c)"),
        ("a/(b*c)", "a / (b * c)"),
        ("(a*b)//c", "a * b // c"),
        ("-(a*b)", "-(a * b)"),
        ("(-a)*b", "-a * b"),
        ("a - -b", "a - -b"),
        ("- - a", "--a"),
        ("f((a + b), [c*(d)], k=(1))", "f(a + b, [c * d], k = 1)"),
        ("3e-4*1.50", "3e-4 * 1.50"),
        ("every  (10*2)  keep 5", "every 10 * 2 keep 5"),
        ("repeat  dec( x ,k=1 )  (n+1)", "repeat dec(x, k = 1) n + 1"),
        ("58   GiB", "58 GiB"),
        ("select()", "select()"),
        ("select(\n)", "select()"),
        ("[]", "[]"),
        ("[\n]", "[]"),
        # The tree drops parentheses, and the spans with them: the line of this `)`
        # is still part of the statement (it used to be copied out as stray code).
        ("(a\n)", "a"),
        ("((a)\n)", "a"),
        ("repeat dec(x) (n\n)", "repeat dec(x) n"),
        ("f(a, (b\n), c)", "f(a, b, c)"),
    ],
)
def test_expressions(source, expected):
    out, _ = format_text(f"model m {{\n x={source}\n}}\n")
    assert out == f"model m {{\n    x = {expected}\n}}\n"


def test_keyword_arguments_keep_their_place():
    out, _ = format_text("model m {\n x = f(k=1, a)\n}\n")
    assert out == "model m {\n    x = f(k = 1, a)\n}\n"


# Whitespace and comments moved around at random: fmt still finds the same tree
# (format_text checks that itself), keeps the comments and reaches a fixed point.

TOKEN = re.compile(
    r'"[^"\n]*"|#[^\n]*|\\[\t ]*\n|\n|[\t ]+'
    r"|[0-9]+[A-Za-z_][A-Za-z0-9_]*[A-Za-z_]"  # a WORD such as 1f1b
    r"|[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|[A-Za-z_][A-Za-z0-9_]*|//|."
)


def _mutate(text: str, rnd: random.Random) -> str:
    out, depth, count = [], 0, 0
    tokens = [t for t in TOKEN.findall(text) if not t.isspace() or t == "\n"]
    for i, tok in enumerate(tokens):
        nxt = tokens[i + 1] if i + 1 < len(tokens) else "\n"
        if tok == "\n":
            if depth == 0 and rnd.random() < 0.3:
                out.append("\n" * rnd.randint(1, 3) + " " * rnd.randint(0, 9))
            else:
                out.append("\n" + " " * rnd.randint(0, 9))
            continue
        if tok.startswith("#") or tok.startswith("\\"):
            out.append(tok)
            continue
        depth += tok in ("(", "[")
        depth -= tok in (")", "]")
        out.append(tok)
        if nxt == "\n" or nxt.startswith("#"):
            continue
        roll = rnd.random()
        if depth > 0 and roll < 0.1:
            count += 1
            out.append(f"  # c{count}\n" + " " * rnd.randint(0, 12))
        elif depth > 0 and roll < 0.15:
            out.append("\n" + " " * rnd.randint(0, 12))
        elif roll < 0.18:
            out.append(" \\\n" + " " * rnd.randint(0, 4))
        else:
            out.append(" " * rnd.randint(1, 3))
    return "".join(out)


@functools.cache
def _parsable() -> list[str]:
    texts = [p.read_text(encoding="utf-8") for p in SPECS]
    return [t for t in texts if parse(t)[0] is not None]


@pytest.mark.parametrize("seed", range(3))
def test_random_layouts(seed):
    rnd = random.Random(seed)
    for _ in range(25):
        mutated = _mutate(rnd.choice(_parsable()), rnd)
        if parse(mutated)[0] is None:
            continue
        # format_text itself checks the tree and the comments against the input.
        out, _ = format_text(mutated)
        assert format_text(out)[0] == out, mutated


# The command ------------------------------------------------------------------

MESSY = "msl 0.1\nmodel m {\n  a=1\n  bb = 2 # two\n}\n"
CLEAN = "msl 0.1\n\nmodel m {\n    a  = 1\n    bb = 2  # two\n}\n"
BROKEN = "msl 0.1\nmodel m {\n  a = = 1\n}\n"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode())
    return path


def test_check_clean_exits_0(tmp_path, capsys):
    path = _write(tmp_path, "clean.msl", CLEAN)
    assert main(["fmt", "--check", str(path)]) == 0
    assert capsys.readouterr().out == ""


def test_check_gpt7b_exits_0(capsys):
    assert main(["fmt", "--check", str(ROOT / "specs" / "gpt7b.msl")]) == 0


def test_check_stale_exits_3_and_writes_nothing(tmp_path, capsys):
    path = _write(tmp_path, "messy.msl", MESSY)
    clean = _write(tmp_path, "clean.msl", CLEAN)
    assert main(["fmt", "--check", str(clean), str(path)]) == 3
    captured = capsys.readouterr()
    assert path.read_bytes() == MESSY.encode()
    assert f"would reformat {path}" in captured.err
    assert "clean.msl" not in captured.err
    assert "-  bb = 2 # two\n" in captured.out
    assert "+    bb = 2  # two\n" in captured.out


def test_rewrite(tmp_path, capsys):
    path = _write(tmp_path, "messy.msl", MESSY)
    assert main(["fmt", str(path)]) == 0
    assert path.read_text() == CLEAN
    assert sorted(p.name for p in tmp_path.iterdir()) == ["messy.msl"]  # no temp file left
    assert main(["fmt", "--check", str(path)]) == 0


def test_crlf_is_a_change(tmp_path, capsys):
    path = _write(tmp_path, "crlf.msl", CLEAN.replace("\n", "\r\n"))
    assert main(["fmt", "--check", str(path)]) == 3
    assert main(["fmt", str(path)]) == 0
    assert path.read_bytes() == CLEAN.encode()


def test_syntax_error_exits_1_and_touches_nothing(tmp_path, capsys):
    broken = _write(tmp_path, "broken.msl", BROKEN)
    messy = _write(tmp_path, "messy.msl", MESSY)
    assert main(["fmt", str(messy), str(broken)]) == 1
    err = capsys.readouterr().err
    assert "broken.msl:3:7: error[MSL001]" in err
    assert broken.read_bytes() == BROKEN.encode()
    assert messy.read_bytes() == MESSY.encode()  # all or nothing


def test_missing_file_exits_2(tmp_path, capsys):
    messy = _write(tmp_path, "messy.msl", MESSY)
    assert main(["fmt", str(messy), str(tmp_path / "nope.msl")]) == 2
    assert "no such spec file" in capsys.readouterr().err
    assert messy.read_bytes() == MESSY.encode()
