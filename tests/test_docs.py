"""docs/language.md stays true: its complete examples check clean, and it covers
every diagnostic code, every op, every block and every key msgen knows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from msgen.cli import main
from msgen.codes import CODES
from msgen.lowering.lower import BLOCK_KINDS, KEYS, MODEL_REQUIRED
from msgen.ops import CALLABLE

DOC = Path(__file__).resolve().parent.parent / "docs" / "language.md"

# A fence opens with ```msl alone on its line (```msl-fragment does not match) and
# closes at the next ``` alone on its line.
EXAMPLE = re.compile(r"^```msl[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^#{1,6} (.*)$", re.MULTILINE)


def doc_text() -> str:
    return DOC.read_text(encoding="utf-8")


def examples() -> list[tuple[int, str]]:
    """(line number of the opening fence, spec text) of every complete example."""
    text = doc_text()
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in EXAMPLE.finditer(text)]


def headings() -> list[str]:
    return HEADING.findall(doc_text())


def test_fences_are_balanced():
    fences = [line for line in doc_text().splitlines() if line.startswith("```")]
    assert len(fences) % 2 == 0, "an unclosed ``` fence in docs/language.md"


def test_doc_has_complete_examples():
    assert len(examples()) >= 4


@pytest.mark.parametrize("line,spec", examples(), ids=[f"line{n}" for n, _ in examples()])
def test_example_checks_clean(line, spec, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / f"example_line{line}.msl"
    path.write_text(spec, encoding="utf-8")
    status = main(["check", str(path)])
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if "error[" in ln or "internal error" in ln]
    assert status == 0, f"docs/language.md example at line {line}:\n{err}"
    assert not errors, f"docs/language.md example at line {line}:\n{err}"


def test_every_code_is_documented():
    text = doc_text()
    missing = [code for code in CODES if code not in text]
    assert not missing, f"codes missing from docs/language.md: {missing}"


def test_every_code_has_a_table_row():
    rows = set(re.findall(r"^\| (MSL\d{3}) \|", doc_text(), re.MULTILINE))
    assert set(CODES) <= rows, f"no table row for: {sorted(set(CODES) - rows)}"
    assert rows <= set(CODES), f"documented codes msgen does not have: {sorted(rows - set(CODES))}"


def test_every_op_has_a_section():
    titles = headings()
    missing = [op for op in CALLABLE if not any(f"`{op}(" in t for t in titles)]
    assert not missing, f"ops without a section in docs/language.md: {missing}"


def test_every_block_has_a_section():
    titles = {t.strip() for t in headings()}
    missing = [kind for kind in BLOCK_KINDS if kind not in {t.lower() for t in titles}]
    assert not missing, f"blocks without a section in docs/language.md: {missing}"


def test_every_key_is_documented():
    text = doc_text()
    keys = {key for block in KEYS.values() for key in block} | set(MODEL_REQUIRED)
    keys |= {"dtype", "param_dtype"}
    missing = sorted(key for key in keys if f"`{key}`" not in text)
    assert not missing, f"keys missing from docs/language.md: {missing}"
