"""compile's output folder when a hostile tree links out of it: the recovery of a
killed run and the model folder itself never follow a symbolic link (a generated
tree is committed to git, which stores links, so a repository can ship both a link
and a manifest that lists paths through it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from msgen.cli import main

ROOT = Path(__file__).resolve().parents[1]
BASE = ROOT / "tests" / "cases" / "base.msl"


def compile_into(out: Path, *flags: str) -> int:
    return main(["compile", str(BASE), "-o", str(out), *flags])


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() if p.is_file() else None
        for p in folder.rglob("*")
    }


def test_recovery_does_not_follow_a_linked_folder_of_the_manifest(tmp_path, capsys):
    out = tmp_path / "out"
    assert compile_into(out) == 0
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    # what the recovery of a killed run renames and deletes, were it inside the tree
    (victim / "sub" / ".a.py.abc.msgen-new").write_text("staged\n")
    (victim / "sub" / ".b.py.msgen-old").write_text("set aside\n")
    (out / "tiny" / "x").symlink_to(Path("..", "..", "victim"))
    manifest = out / "tiny" / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["files"]["x/sub/a.py"] = None
    manifest.write_text(json.dumps(doc, indent=2))
    before = snapshot(victim)
    assert compile_into(out) == 2
    err = capsys.readouterr().err
    assert "tiny/x is a symbolic link" in err and "nothing was written" in err
    assert snapshot(victim) == before


@pytest.mark.parametrize("dangling", [False, True])
def test_a_linked_model_folder_is_refused(tmp_path, capsys, dangling):
    out = tmp_path / "out"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere"
    if not dangling:
        elsewhere.mkdir()
    (out / "tiny").symlink_to(elsewhere)
    assert compile_into(out) == 2
    err = capsys.readouterr().err
    assert f"{out / 'tiny'} is a symbolic link" in err, err
    assert "File exists" not in err and "tiny/." not in err
    assert not elsewhere.exists() or list(elsewhere.iterdir()) == []
    assert (out / "tiny").is_symlink()


def test_a_manifest_nested_past_the_json_parser_is_damaged_not_a_crash(tmp_path, capsys):
    out = tmp_path / "out"
    assert compile_into(out) == 0
    (out / "tiny" / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    assert compile_into(out) == 2
    assert "manifest.json is damaged" in capsys.readouterr().err
    assert compile_into(out, "--check") in (2, 3)
    assert compile_into(out, "--force") == 0
