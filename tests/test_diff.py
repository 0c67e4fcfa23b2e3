"""`msgen diff`: golden cases (tests/diff_cases/<case>/old.msl and new.msl in, the
expected text, Markdown and JSON out), the deltas against `msgen estimate --json` of
each side, the file list against what `msgen compile` changes on disk, --base in a
git repository, the Markdown's tables as a Markdown parser reads them, the
published schema, deterministic bytes.

MSGEN_UPDATE_GOLDEN=1 rewrites the expected files (read the diff before committing).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import pytest

from msgen.cli import main
from msgen.review.command import DiffOptions, diff_report
from msgen.review.model import DiffReport
from msgen.review.render import render_json, render_markdown, render_text

CASES_DIR = Path(__file__).resolve().parent / "diff_cases"
CASES = sorted(p.name for p in CASES_DIR.iterdir() if p.is_dir())
FAILING = {"new_errors", "over_budget"}  # NEW does not compile: exit 1
SCHEMA = Path(__file__).resolve().parents[1] / "docs" / "diff.schema.json"
GOLDEN = {"text": "expected.txt", "markdown": "expected.md", "json": "expected.json"}
RENDER = {"text": render_text, "markdown": render_markdown, "json": render_json}


@contextmanager
def inside(folder: Path):
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


@cache
def report(case: str) -> DiffReport:
    with inside(CASES_DIR / case):
        return diff_report(DiffOptions(Path("new.msl"), Path("old.msl")))


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["diff", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_every_case_named_by_the_issue_is_here():
    assert set(CASES) == {"tp", "pp_adds_stage", "recompute", "fusion", "batch",
                          "model_dim", "unchanged", "new_errors", "over_budget",
                          "device_ips_added", "device_ips_removed", "sharding"}  # fmt: skip


@pytest.mark.parametrize("case", CASES)
def test_golden_text_through_the_command_line(case, capsys):
    with inside(CASES_DIR / case):
        code, out, err = run(capsys, "old.msl", "new.msl")
    assert (code, err) == (1 if case in FAILING else 0, "")
    assert out == golden(case, "text", out)


@pytest.mark.parametrize("fmt", ["markdown", "json"])
@pytest.mark.parametrize("case", CASES)
def test_golden_markdown_and_json(case, fmt):
    text = RENDER[fmt](report(case))
    assert text == golden(case, fmt, text)


def golden(case: str, fmt: str, got: str) -> str:
    path = CASES_DIR / case / GOLDEN[fmt]
    if os.environ.get("MSGEN_UPDATE_GOLDEN"):
        path.write_text(got, encoding="utf-8")
    return path.read_text(encoding="utf-8")


def test_the_verdicts_say_what_changed():
    """The first line a reviewer reads, checked against the issue's wording."""
    assert report("unchanged").verdict.startswith("no change")
    assert not report("unchanged").changed
    assert report("new_errors").verdict.startswith("new.msl has ")
    assert "MSL201" in report("new_errors").verdict
    assert report("over_budget").verdict.startswith("no longer fits; peak +")
    assert report("tp").verdict.startswith("fits before and after; peak -")
    assert "on stage 0 (38.81 → " in report("tp").verdict


# --- the numbers are estimate --json's --------------------------------------------

STAGE_ITEMS = ("params", "weights_bytes", "grads_bytes", "accumulation_bytes",
               "optimizer_bytes", "activations_bytes", "other_activations_bytes",
               "logits_bytes", "hccl_bytes", "total_bytes")  # fmt: skip
TIME_ITEMS = ("step_s", "tokens_per_s_per_device", "mfu", "hfu")
STAGE_TERMS = ("compute_s", "tp_comm_s", "pp_comm_s", "bubble_s", "idle_s", "dp_comm_s",
               "optimizer_s", "total_s")  # fmt: skip


def estimate_json(capsys, spec: str) -> dict:
    main(["estimate", spec, "--json"])
    out, _ = capsys.readouterr()
    return json.loads(out)


def check_items(found: list, old: dict | None, new: dict | None, keys: tuple, always: str | None):
    """Every listed item is the two estimates' values and their difference; every
    key left out is equal on both sides."""
    listed = {i.item: i for i in found}
    for key in keys:
        a = old[key] if old else None
        b = new[key] if new else None
        if key in listed:
            i = listed[key]
            assert (i.old, i.new) == (a, b), key
            assert i.delta == (None if a is None or b is None else b - a), key
        else:
            assert a == b and key != always, key


@pytest.mark.parametrize("case", sorted(set(CASES) - {"new_errors"}))
def test_deltas_are_the_difference_of_estimate_json(case, capsys):
    with inside(CASES_DIR / case):
        old, new = estimate_json(capsys, "old.msl"), estimate_json(capsys, "new.msl")
    diff = report(case)
    m = diff.memory
    assert (m.fits_old, m.fits_new, m.budget_old, m.budget_new) == (
        old["fits"], new["fits"], old["budget_bytes"], new["budget_bytes"])  # fmt: skip
    a = {s["stage"]: s for s in old["stages"]}
    b = {s["stage"]: s for s in new["stages"]}
    listed = {s.stage: s for s in m.stages}
    for n in sorted(a.keys() | b.keys()):
        if n in listed:
            s = listed[n]
            check_items(s.items, a.get(n), b.get(n), STAGE_ITEMS, "total_bytes")
            assert (s.fits_old, s.fits_new) == (a[n]["fits"] if n in a else None,
                                                b[n]["fits"] if n in b else None)  # fmt: skip
        else:
            assert all(a[n][k] == b[n][k] for k in STAGE_ITEMS)
    check_items([m.params_total] if m.params_total else [], old, new, ("params_total",), None)
    t = diff.time
    check_items(t.items, old["time"], new["time"], TIME_ITEMS, None)
    a = {s["stage"]: s for s in old["time"]["stages"]}
    b = {s["stage"]: s for s in new["time"]["stages"]}
    listed = {s.stage: s for s in t.stages}
    for n in sorted(a.keys() | b.keys()):
        if n in listed:
            check_items(listed[n].terms, a.get(n), b.get(n), STAGE_TERMS, "total_s")
        else:
            assert all(a[n][k] == b[n][k] for k in STAGE_TERMS)


def test_a_verdict_a_budget_flips_is_listed_with_no_byte_moved(capsys):
    """pp_adds_stage's NEW (stage 0 needs 27.34 GiB, stage 1 27.24 GiB, of 58) against
    itself with the budget lowered to 27,960 MiB = 27.30 GiB: no item of either stage
    moves, stage 0 no longer fits and stage 1 still does (each side's `msgen estimate
    --json` says which). The stage whose verdict flipped is in the memory table with
    both verdicts; the one whose verdict held is not."""
    budget = "budget.device_memory=27960 MiB"
    with inside(CASES_DIR / "pp_adds_stage"):
        old = estimate_json(capsys, "new.msl")
        assert main(["estimate", "new.msl", "--json", "--set", budget]) == 1
        new = json.loads(capsys.readouterr().out)
        diff = diff_report(DiffOptions(Path("new.msl"), Path("new.msl"), overrides=(budget,)))
    before = {s["stage"]: s["fits"] for s in old["stages"]}
    after = {s["stage"]: s["fits"] for s in new["stages"]}
    assert (before, after) == ({0: True, 1: True}, {0: False, 1: True})
    listed = {s.stage: (s.fits_old, s.fits_new) for s in diff.memory.stages}
    assert listed == {n: (before[n], after[n]) for n in before if before[n] != after[n]}
    assert all(i.delta == 0 for s in diff.memory.stages for i in s.items)
    rows = [line.split() for line in render_text(diff).splitlines()]
    assert ["0", "verdict", "fits", "over", "budget"] in rows


def test_a_parameter_whose_gradient_source_changes_is_listed():
    """specs/tiny_llama.msl (dp 2, tp 2, pp 2, zero 1) against itself at zero 0. Each
    parameter has a replica on its stage's other dp rank, so with the parallel
    optimizer its mirror returns its gradient, and without it the gradient is read
    from `accu_grads` (msgen/analysis/gradients.py): one row, every parameter, mirror
    to accu_grads (plan.json's `gradient_from`)."""
    spec = Path(__file__).resolve().parents[1] / "specs" / "tiny_llama.msl"
    diff = diff_report(DiffOptions(spec, spec, overrides=("train.zero=0",)))
    (row,) = [c for c in diff.params or [] if c.aspect == "gradient_from"]
    assert (row.old, row.new) == ("mirror", "accu_grads")
    doc = json.loads((Path(__file__).resolve().parents[1] / "generated" / "tiny_llama" /
                      "plan.json").read_text())  # fmt: skip
    paths = {p["path"] for p in doc["params"]}
    paths |= {f"{r['layer']}.*.{r['name']}" for r in doc["layer_params"]}
    assert set(row.params) == paths


def test_a_stage_pp_adds_is_listed_as_added(capsys):
    stages = {s.stage: s.change for s in report("pp_adds_stage").memory.stages}
    assert stages == {0: "changed", 1: "added"}
    assert {s.stage: s.change for s in report("pp_adds_stage").time.stages}[1] == "added"


# --- the files are what compile changes -------------------------------------------


def tree(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def numstat(a: Path, b: Path, rel: str) -> tuple[int, int]:
    """(added, removed) lines of one file, as git counts them."""
    done = subprocess.run(["git", "diff", "--no-index", "--numstat", str(a / rel), str(b / rel)],
                          capture_output=True, text=True)  # fmt: skip
    added, removed, _ = done.stdout.split("\t", 2)
    return int(added), int(removed)


@pytest.mark.parametrize("case", sorted(set(CASES) - FAILING))
def test_the_file_list_is_what_compile_changes(case, tmp_path, capsys):
    """Compile OLD, snapshot the tree, compile NEW over it (as the same spec file, as
    a pull request edits it), snapshot again: the files that changed on disk, and
    their line counts as git counts them, are the diff's."""
    spec = tmp_path / "new.msl"  # the name the diff emits both sides under
    with inside(tmp_path):
        shutil.copy(CASES_DIR / case / "old.msl", spec)
        assert main(["compile", "new.msl", "-o", "out"]) == 0
        shutil.copytree(tmp_path / "out", tmp_path / "before")
        shutil.copy(CASES_DIR / case / "new.msl", spec)
        assert main(["compile", "new.msl", "-o", "out"]) == 0
    capsys.readouterr()
    before, after = tmp_path / "before" / "gpt7b", tmp_path / "out" / "gpt7b"
    a, b = tree(before), tree(after)
    want = {}
    for rel in sorted(a.keys() | b.keys()):
        if a.get(rel) != b.get(rel):
            change = "changed" if rel in a and rel in b else "added" if rel in b else "removed"
            counts = numstat(before, after, rel) if change == "changed" else ()
            want[rel] = (change, *counts)
    got = {
        f.path: (f.change, f.added_lines, f.removed_lines) if f.change == "changed" else (f.change,)
        for f in report(case).files
    }
    assert got == want
    for f in report(case).files:
        assert (f.old_lines, f.new_lines) == (
            len(a.get(f.path, b"").splitlines()), len(b.get(f.path, b"").splitlines()))  # fmt: skip
