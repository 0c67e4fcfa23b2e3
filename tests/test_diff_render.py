"""`msgen diff`'s renderings: the Markdown as a Markdown parser (markdown-it-py, with
GitHub's tables) reads it, the JSON against the published schema (jsonschema), the
same bytes whatever the hash seed, and the command line's usage errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jsonschema
import pytest
from markdown_it import MarkdownIt
from test_diff import CASES, CASES_DIR, SCHEMA, inside, report, run

from msgen.review.model import DiffReport
from msgen.review.render import markdown_table, render_markdown
from msgen.review.sections import Table

# What each section's tables are headed with, as the issue names the areas.
HEADS = {
    "Settings": [["setting", "old", "new", "where"]],
    "Memory per device": [["stage", "item", "old", "new", "delta"]],
    "Step time": [["measure", "old", "new", "delta"], ["stage", "term", "old", "new", "delta"]],
    "Ops": [["op", "aspect", "old", "new"]],
    "Parameters": [["parameters", "aspect", "old", "new"]],
    "Generated files": [["file", "change", "old lines", "new lines", "added", "removed"]],
}
# The columns of numbers, right-aligned (a diagnostics table's: its line).
NUMERIC = {
    "Memory per device": {"old", "new", "delta"},
    "Step time": {"old", "new", "delta"},
    "Generated files": {"old lines", "new lines", "added", "removed"},
}


def tables(tokens) -> list[dict]:
    """Each table: its section (the summary before it), its header cells, its body rows
    as lists of cell texts, and each header cell's alignment."""
    out, section, row = [], None, None
    for i, t in enumerate(tokens):
        if t.type == "html_block" and "<summary>" in t.content:
            section = t.content.split("<summary>")[1].split(":")[0]
        elif t.type == "table_open":
            out.append({"section": section, "head": [], "rows": [], "align": []})
        elif t.type == "tr_open":
            row = []
        elif t.type in ("th_open", "td_open"):
            # the cell as a reader sees it: its text and code, markup gone
            inline = tokens[i + 1].children or []
            row.append("".join(c.content for c in inline if c.type in ("text", "code_inline")))
            if t.type == "th_open":
                out[-1]["align"].append(t.attrGet("style"))
        elif t.type == "tr_close":
            out[-1]["head" if not out[-1]["head"] else "rows"].append(row)
    for t in out:
        (t["head"],) = t["head"]
    return out


@pytest.mark.parametrize("case", CASES)
def test_the_markdown_tables_have_their_shape(case):
    md = MarkdownIt("commonmark").enable("table")
    text = render_markdown(report(case))
    found = tables(md.parse(text))
    sections = [t["section"] for t in found]
    for section in dict.fromkeys(sections):
        if section in HEADS:
            assert [t["head"] for t in found if t["section"] == section] == HEADS[section]
    for t in found:
        assert t["rows"], t["section"]  # no empty table
        assert all(len(r) == len(t["head"]) for r in t["rows"])
        for head, align in zip(t["head"], t["align"], strict=True):
            right = head in NUMERIC.get(t["section"], {"line"})
            assert align == ("text-align:right" if right else "text-align:left")
    # one collapsible section per area that changed, closed; nothing for the rest
    assert text.count("<details>") == text.count("</details>") == len(dict.fromkeys(sections))
    r = report(case)
    assert ("Settings" in sections) == bool(r.settings)
    assert ("Generated files" in sections) == bool(r.files)
    assert ("Ops" in sections) == bool(r.ops)
    if case == "unchanged":
        assert found == [] and "<details>" not in text


def test_the_markdown_of_a_pp_change_lists_the_new_stage():
    md = MarkdownIt("commonmark").enable("table")
    (memory,) = [t for t in tables(md.parse(render_markdown(report("pp_adds_stage"))))
                 if t["section"] == "Memory per device"]  # fmt: skip
    stage1 = [r for r in memory["rows"] if r[0] == "1"]
    assert [r[1] for r in stage1][-2:] == ["total", "verdict"]
    assert all(r[2] == "—" for r in stage1)  # not there before


def test_the_published_schema_is_the_models_and_the_json_follows_it():
    """docs/diff.schema.json is DiffReport's schema (regenerate it with
    `json.dumps(DiffReport.model_json_schema(), indent=2)` when the models change)."""
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    assert (
        SCHEMA.read_text(encoding="utf-8")
        == json.dumps(DiffReport.model_json_schema(), indent=2) + "\n"
    )
    for case in CASES:
        jsonschema.validate(json.loads((CASES_DIR / case / "expected.json").read_text()), schema)
    bad = json.loads((CASES_DIR / "tp" / "expected.json").read_text())
    bad["memory"]["stages"][0]["change"] = "moved"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_the_same_bytes_whatever_the_hash_seed():
    outs = []
    for seed in ("0", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        done = subprocess.run(
            [sys.executable, "-m", "msgen.cli", "diff", "old.msl", "new.msl", "--format", "json"],
            cwd=CASES_DIR / "pp_adds_stage", env=env, capture_output=True, check=True,
        )  # fmt: skip
        outs.append(done.stdout)
    assert outs[0] == outs[1] == (CASES_DIR / "pp_adds_stage" / "expected.json").read_bytes()


def test_usage_errors_are_one_line_and_exit_2(capsys, tmp_path):
    with inside(CASES_DIR / "tp"):
        assert run(capsys, "old.msl")[0] == 2
        assert run(capsys, "old.msl", "new.msl", "-o", "") == (
            2,
            "",
            "msgen: error: -o needs a file name\n",
        )
        code, out, err = run(capsys, "old.msl", "missing.msl")
        assert (code, out, err) == (2, "", "msgen: error: no such spec file: missing.msl\n")
        code, _, err = run(capsys, "old.msl", "new.msl", "--base", "HEAD")
        assert code == 2 and err.count("\n") == 1
        code, _, err = run(capsys, "old.msl", "new.msl", "-o", "old.msl")
        assert code == 2 and "the spec itself" in err
        with pytest.raises(SystemExit) as exc:
            run(capsys, "old.msl", "new.msl", "--format", "html")
        assert exc.value.code == 2


def test_output_file_holds_what_stdout_would(capsys, tmp_path):
    out = tmp_path / "diff.md"
    with inside(CASES_DIR / "recompute"):
        code, printed, _ = run(capsys, "old.msl", "new.msl", "--format", "markdown", "-o", str(out))
    assert (code, printed) == (0, "")
    assert out.read_text(encoding="utf-8") == (CASES_DIR / "recompute" / "expected.md").read_text()


def test_set_changes_new_only(capsys):
    """`diff S S --set mesh.tp=4`: what the what-if does to the spec as it is."""
    with inside(CASES_DIR / "tp"):
        code, out, _ = run(capsys, "old.msl", "old.msl", "--set", "mesh.tp=4", "--format", "json")
    doc = json.loads(out)
    assert code == 0
    tp = next(s for s in doc["settings"] if s["setting"] == "mesh.tp")
    assert (tp["old"], tp["new"], tp["new_by_option"]) == ("2", "4", True)
    # the devices stay 8: dp follows (the note says so)
    dp = next(s for s in doc["settings"] if s["setting"] == "mesh.dp")
    assert (dp["old"], dp["new"]) == ("4", "2")
    assert any("dp 4 → 2" in note for note in doc["notes"])
    assert doc["new"]["label"] == "old.msl --set mesh.tp=4"


def test_the_docs_example_is_the_golden_markdown():
    doc = (SCHEMA.parent / "diff.md").read_text(encoding="utf-8")
    example = doc.split("````markdown\n", 1)[1].split("````", 1)[0]
    assert example == (CASES_DIR / "recompute" / "expected.md").read_text(encoding="utf-8")


def test_cells_read_as_written_whatever_they_hold():
    """Emphasis, links, HTML, code and pipes in a value stay text in the table."""
    hostile = "a *b* __c__ [d](e) <f> `g` | h\\"
    table = Table(("text", "code"), "tc", [(hostile, hostile)])
    md = MarkdownIt("commonmark").enable("table")
    (found,) = tables(md.parse("\n".join(markdown_table(table)) + "\n"))
    assert found["rows"] == [[hostile, hostile]]


def test_the_diagnostics_of_a_new_with_errors_are_in_the_markdown():
    md = MarkdownIt("commonmark").enable("table")
    r = report("new_errors")
    (diags,) = [t for t in tables(md.parse(render_markdown(r))) if t["section"] == "new.msl"]
    assert [row[3] for row in diags["rows"]] == [d.message for d in r.new.diagnostics]
    assert [row[2] for row in diags["rows"]] == ["MSL301", "MSL201", "MSL303"]


def test_an_old_with_errors_is_reported_and_the_change_that_fixes_it_exits_0(capsys):
    with inside(CASES_DIR / "new_errors"):
        code, out, _ = run(capsys, "new.msl", "old.msl", "--format", "json")
    doc = json.loads(out)
    assert code == 0
    assert doc["verdict"] == "new.msl has 3 errors (MSL201, MSL301, MSL303); old.msl fits"
    assert doc["old"]["status"] == "errors" and doc["new"]["status"] == "ok"
    assert [s["setting"] for s in doc["settings"]] == ["mesh.tp"]
    assert doc["memory"] is doc["files"] is None  # nothing to compare them with


def test_a_new_that_does_not_parse_compares_nothing_but_says_why(capsys, tmp_path):
    (tmp_path / "broken.msl").write_text("msl 0.1\nmodel x {\n", encoding="utf-8")
    with inside(CASES_DIR / "tp"):
        code, out, _ = run(capsys, "old.msl", str(tmp_path / "broken.msl"), "--format", "json")
    doc = json.loads(out)
    assert code == 1
    assert [d["code"] for d in doc["new"]["diagnostics"]] == ["MSL003"]
    assert doc["settings"] is None and doc["verdict"].endswith("MSL003): it does not compile")
