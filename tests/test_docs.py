"""docs/language.md stays true: its complete examples check clean, and it covers
every diagnostic code, every op, every block and every key msgen knows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from msgen.cli import main
from msgen.codes import CODES
from msgen.compiler import analyze_text
from msgen.ir import models
from msgen.ir.schema import (
    BLOCK_KINDS,
    KEYS,
    MODEL_REQUIRED,
    MODEL_SETTINGS,
    OPTIMIZERS,
    SCHEDULES,
    Schedule,
    signature,
)
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


def test_a_worked_example_splits_the_experts_of_a_moe_op_over_ep(tmp_path):
    """The mixture-of-experts example: a complete spec with a moe op whose experts the
    mesh splits over ep > 1 (that it checks clean is test_example_checks_clean's)."""
    worked = []
    for line, spec in examples():
        result = analyze_text(spec, f"example_line{line}.msl", tmp_path)
        graphs = result.facts.graphs.values() if result.ok else ()
        experts = [p for g in graphs for of in g.ops.values() if of.node.kind == "moe"
                   for p in of.params if p.name != "router"]  # fmt: skip
        if experts and result.spec.mesh.ep > 1:
            assert all(p.split[0] == ("ep",) for p in experts if len(p.shape) == 3), line
            worked.append(line)
    assert worked, "docs/language.md has no complete example of a moe op with ep > 1"


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


# The section each block's key table sits under, and the model holding its defaults.
KEY_TABLES = {
    "model": ("### model", models.Model),
    "cluster": ("### cluster", models.Cluster),
    "mesh": ("### mesh", models.Mesh),
    "pipeline": ("## Pipeline", models.Pipeline),
    "train": ("## Train", models.Train),
    "budget": ("## Budget", models.Budget),
}
KEY_CELL = re.compile(r"^`(\w+)`$")


def key_table(heading: str) -> dict[str, dict[str, str]]:
    """The first `| key | ...` table after the heading: row cells by column name."""
    lines = doc_text().splitlines()
    start = lines.index(heading)
    at = next(i for i in range(start, len(lines)) if lines[i].startswith("| key |"))
    columns = [c.strip() for c in lines[at].strip("|").split("|")]
    rows = {}
    for line in lines[at + 2 :]:
        if not line.startswith("|"):
            break
        cells = dict(zip(columns, (c.strip() for c in line.strip("|").split("|")), strict=True))
        name = KEY_CELL.match(cells["key"])
        if name:  # "any other name" (a dim) is not a key
            rows[name.group(1)] = cells
    return rows


def schema_keys(block: str) -> dict[str, bool]:
    if block == "model":
        return {k: True for k in MODEL_REQUIRED} | {k: False for k in MODEL_SETTINGS}
    return KEYS[block]


@pytest.mark.parametrize("block", sorted(KEY_TABLES))
def test_key_tables_follow_the_schema(block):
    """Each block's table lists the schema's keys, says which are required, and
    shows the default the IR gives a key that is not written."""
    heading, model = KEY_TABLES[block]
    rows = key_table(heading)
    keys = schema_keys(block)
    assert sorted(rows) == sorted(keys), f"docs/language.md's {block} table and the schema differ"
    for key, required in keys.items():
        if "required" in rows[key]:
            assert rows[key]["required"] == ("yes" if required else "no"), (block, key)
        else:
            assert not required, (block, key)
        default = model.model_fields[key].default if key in model.model_fields else None
        if not required and isinstance(default, int | str) and default != "":
            text = str(default).lower() if isinstance(default, bool) else str(default)
            assert rows[key]["default"].startswith(f"`{text}`"), (block, key, default)


def test_every_block_with_keys_has_a_table():
    assert set(KEYS) | {"model"} == set(KEY_TABLES)


def test_optimizer_and_schedule_signatures_are_documented():
    text = doc_text()
    for table in (OPTIMIZERS, SCHEDULES):
        for name, args in table.items():
            assert f"`{signature(name, args)}`" in text, signature(name, args)
    row = key_table("## Pipeline")["schedule"]["value"]
    assert all(f"`{s}" in row for s in Schedule), row
