"""`msgen diff --base REF SPEC`: the spec against its version at a git revision, in a
repository made for the test (two commits); outside a repository, an unknown
revision, a spec that did not exist at REF: one line and exit 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_diff import CASES_DIR, inside, run


def git(repo, *args):
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
                   cwd=repo, check=True, capture_output=True)  # fmt: skip


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """specs/model.msl committed as the tp case's OLD, then as its NEW."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    (tmp_path / "specs").mkdir()
    git(tmp_path, "init", "-q")
    spec = tmp_path / "specs" / "model.msl"
    for side in ("old", "new"):
        shutil.copy(CASES_DIR / "tp" / f"{side}.msl", spec)
        git(tmp_path, "add", "-A")
        git(tmp_path, "commit", "-q", "-m", side)
    return tmp_path


def without_labels(doc: dict) -> dict:
    for side in ("old", "new"):
        doc[side].pop("label")
    doc.pop("notes")
    return doc


def test_base_is_the_diff_of_the_two_commits(repo, capsys):
    with inside(repo):
        code, out, err = run(capsys, "--base", "HEAD~1", "specs/model.msl", "--format", "json")
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert (doc["old"]["label"], doc["new"]["label"]) == (
        "HEAD~1:specs/model.msl",
        "specs/model.msl",
    )
    want = json.loads((CASES_DIR / "tp" / "expected.json").read_text(encoding="utf-8"))
    assert without_labels(doc) == without_labels(want)


def test_base_from_another_folder_and_an_uncommitted_edit(repo, capsys):
    """The path is the spec's own, wherever the command runs; the working copy is NEW."""
    spec = repo / "specs" / "model.msl"
    spec.write_text(spec.read_text().replace("micro_batches = 128", "micro_batches = 256")
                    .replace("global_batch = 256", "global_batch = 512"))  # fmt: skip
    with inside(repo / "specs"):
        code, out, _ = run(capsys, "--base", "HEAD", "model.msl", "--format", "json")
    settings = {s["setting"]: (s["old"], s["new"]) for s in json.loads(out)["settings"]}
    assert code == 0
    assert settings == {
        "pipeline.micro_batches": ("128", "256"),
        "train.global_batch": ("256", "512"),
    }


def test_base_outside_a_repository(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    shutil.copy(CASES_DIR / "tp" / "old.msl", tmp_path / "model.msl")
    with inside(tmp_path):
        code, out, err = run(capsys, "--base", "HEAD", "model.msl")
    assert (code, out) == (2, "")
    assert err == "msgen: error: --base HEAD: model.msl is not in a git repository\n"


def test_base_where_the_spec_did_not_exist(repo, capsys):
    shutil.copy(CASES_DIR / "tp" / "old.msl", repo / "specs" / "added.msl")
    with inside(repo):
        code, out, err = run(capsys, "--base", "HEAD", "specs/added.msl")
    assert (code, out) == (2, "")
    assert err == "msgen: error: --base HEAD: specs/added.msl did not exist at HEAD\n"


def test_base_with_an_unknown_revision(repo, capsys):
    with inside(repo):
        code, _, err = run(capsys, "--base", "no-such-branch", "specs/model.msl")
        assert code == 2 and "no such revision" in err
        code, _, err = run(capsys, "--base=--output=x", "specs/model.msl")
        assert code == 2 and "cannot start with '-'" in err


def test_set_with_base_changes_the_working_copy_only(repo, capsys):
    with inside(repo):
        code, out, _ = run(capsys, "--base", "HEAD", "specs/model.msl", "--set", "train.seed=7",
                           "--format", "json")  # fmt: skip
    changes = [(s["setting"], s["old"], s["new"]) for s in json.loads(out)["settings"]]
    assert (code, changes) == (0, [("train.seed", "1234", "7")])


def recipe_step() -> str:
    """The shell of docs/diff.md's GitHub Actions step that runs the diffs, with the
    base branch GitHub would fill in."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "diff.md").read_text(encoding="utf-8")
    workflow = yaml.safe_load(doc.split("```yaml\n", 1)[1].split("```", 1)[0])
    (step,) = [s for s in workflow["jobs"]["diff"]["steps"] if s.get("id") == "diff"]
    return step["run"].replace("${{ github.base_ref }}", "main")


@pytest.mark.parametrize("case,status", [("tp", "0"), ("new_errors", "1")])
def test_the_ci_recipe_runs_as_documented(case, status, tmp_path, monkeypatch):
    """A pull request that edits one spec and adds another: one diff, posted as
    Markdown; the job's status is 1 when the edited spec no longer compiles."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    (tmp_path / "specs").mkdir()
    git(tmp_path, "init", "-q", "-b", "main")
    shutil.copy(CASES_DIR / case / "old.msl", tmp_path / "specs" / "model.msl")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "base")
    git(tmp_path, "update-ref", "refs/remotes/origin/main", "HEAD")
    git(tmp_path, "checkout", "-q", "-b", "change")
    shutil.copy(CASES_DIR / case / "new.msl", tmp_path / "specs" / "model.msl")
    shutil.copy(CASES_DIR / case / "old.msl", tmp_path / "specs" / "added.msl")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-q", "-m", "change")
    env = dict(os.environ, GITHUB_OUTPUT=str(tmp_path / "output"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")  # fmt: skip
    # as GitHub runs a step's script
    subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", recipe_step()],
                   cwd=tmp_path, env=env, check=True)  # fmt: skip
    assert (tmp_path / "output").read_text() == f"status={status}\n"
    posted = (tmp_path / "diff.md").read_text(encoding="utf-8")
    want = (CASES_DIR / case / "expected.md").read_text(encoding="utf-8")
    want = want.replace("old.msl", "origin/main:specs/model.msl").replace(
        "new.msl", "specs/model.msl"
    )
    assert posted == want + "\n"  # the added spec has no diff
