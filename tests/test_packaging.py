"""The package as users get it: the built wheel, installed on its own, and a light import.

The wheel tests build an sdist and a wheel from it (so the sdist must carry `grammar/`
and `templates/` too), install the wheel with its declared dependencies into a fresh
venv that sees nothing of this checkout, and run the installed `msgen` there. They are
marked `wheel`: `pytest -m "not wheel"` leaves them out.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SPECS = REPO / "specs"
HEAVY = ("mindspore", "black", "jinja2", "tokenizers", "pyarrow")


def _env() -> dict[str, str]:
    """The environment for a child process that must not see this checkout."""
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV"):
        env.pop(name, None)
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _run(args: list[str | Path], *, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _explain(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An sdist, and a wheel built from that sdist (what `python -m build` does)."""
    out = tmp_path_factory.mktemp("dist")
    proc = _run([sys.executable, "-m", "build", "--outdir", out, REPO], cwd=REPO, timeout=600)
    assert proc.returncode == 0, _explain(proc)
    wheels = sorted(out.glob("msgen-*.whl"))
    sdists = sorted(out.glob("msgen-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in out.iterdir())
    return {"wheel": wheels[0], "sdist": sdists[0]}


@pytest.fixture(scope="module")
def installed(dists: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel and its declared dependencies, nothing else."""
    root = tmp_path_factory.mktemp("wheel-venv")
    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=False, clear=True).create(env_dir)
    python = env_dir / "bin" / "python"
    # This test environment's pip installs into the new venv (`--python`), which saves
    # bootstrapping a pip of its own; the wheel's dependencies come from the package index
    # as they would for a user, which also checks that the metadata declares them all.
    proc = _run(
        [sys.executable, "-m", "pip", "--python", python, "install", dists["wheel"]],
        cwd=root,
        timeout=900,
    )
    assert proc.returncode == 0, _explain(proc)
    # A working folder outside the checkout with the spec and the file it reads.
    work = root / "work"
    (work / "specs").mkdir(parents=True)
    for name in ("gpt7b.msl", "hccn.conf"):
        shutil.copy2(SPECS / name, work / "specs" / name)
    return env_dir


@pytest.mark.wheel
def test_wheel_carries_grammar_and_templates(dists: dict[str, Path]) -> None:
    with zipfile.ZipFile(dists["wheel"]) as whl:
        names = whl.namelist()
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = whl.read(entry_points).decode()
    assert "msgen/grammar/msl.lark" in names
    templates = sorted(n for n in names if n.startswith("msgen/templates/"))
    assert templates, "no msgen/templates/ in the wheel"
    for repo_file in sorted((REPO / "templates").rglob("*")):
        if repo_file.is_file() and "__pycache__" not in repo_file.parts:
            rel = repo_file.relative_to(REPO).as_posix()
            assert f"msgen/{rel}" in names, f"{rel} is missing from the wheel"
    # Shipped inside the package only: nothing lands at the top of site-packages.
    assert not [n for n in names if n.split("/")[0] in {"grammar", "templates", "tests", "specs"}]
    assert "msgen/cli.py" in names
    assert "msgen = msgen.cli:main" in scripts


@pytest.mark.wheel
def test_sdist_carries_grammar_and_templates(dists: dict[str, Path]) -> None:
    with tarfile.open(dists["sdist"]) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert "grammar/msl.lark" in names
    assert any(n.startswith("templates/") for n in names)
    assert "pyproject.toml" in names


@pytest.mark.wheel
def test_installed_wheel_finds_its_resources(installed: Path) -> None:
    python = installed / "bin" / "python"
    code = textwrap.dedent("""
        import json, msgen
        from msgen.resources import resource_dir
        from msgen.syntax import msl_tables
        from msgen.syntax.parser import grammar_source, tables_fit
        print(json.dumps({
            "package": msgen.__file__,
            "grammar": str(resource_dir("grammar")),
            "templates": str(resource_dir("templates")),
            "tables_fit": tables_fit(grammar_source(), msl_tables),
        }))
        """)
    proc = _run([python, "-c", code], cwd=installed.parent / "work", timeout=120)
    assert proc.returncode == 0, _explain(proc)
    where = json.loads(proc.stdout.strip().splitlines()[-1])
    package = Path(where["package"]).parent
    assert package.is_relative_to(installed), where
    assert Path(where["grammar"]) == package / "grammar", where
    assert Path(where["templates"]) == package / "templates", where
    assert (package / "grammar" / "msl.lark").is_file()
    # the prebuilt parse tables ship and fit the shipped grammar (and lark)
    assert where["tables_fit"] is True, where


@pytest.mark.wheel
def test_installed_wheel_checks_a_spec(installed: Path) -> None:
    msgen = installed / "bin" / "msgen"
    assert msgen.is_file(), "the wheel installed no `msgen` script"
    proc = _run([msgen, "check", "specs/gpt7b.msl"], cwd=installed.parent / "work", timeout=120)
    assert proc.returncode == 0, _explain(proc)
    assert "Traceback" not in proc.stderr, _explain(proc)


@pytest.mark.wheel
def test_installed_wheel_compiles_a_spec(installed: Path) -> None:
    """Compiling reads the templates, so this finds them in the installed package."""
    work = installed.parent / "work"
    out = work / "generated"
    shutil.rmtree(out, ignore_errors=True)
    msgen = installed / "bin" / "msgen"
    proc = _run([msgen, "compile", "specs/gpt7b.msl", "-o", "generated/"], cwd=work, timeout=300)
    assert proc.returncode == 0, _explain(proc)
    assert (out / "gpt7b" / "model.py").is_file()
    assert (out / "gpt7b" / "manifest.json").is_file()


def _modules_after(code: str) -> dict:
    """Run `code` in a fresh interpreter from the checkout; report the heavy modules loaded.

    `code` runs first; then the child prints one JSON line naming which of HEAVY are in
    sys.modules. Whatever `code` prints goes to stderr so it cannot be mistaken for it.
    """
    body = textwrap.indent(textwrap.dedent(code).strip(), "    ")
    script = "\n".join(
        [
            "import contextlib, json, sys",
            "result = {}",
            "with contextlib.redirect_stdout(sys.stderr):",
            body,
            f"heavy = sorted(m for m in {HEAVY!r} if m in sys.modules)",
            'print(json.dumps({"heavy": heavy, "result": result}))',
        ]
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, _explain(proc)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_import_msgen_is_light() -> None:
    report = _modules_after("import msgen\n")
    assert report["heavy"] == [], f"`import msgen` loaded {report['heavy']}"


def test_check_does_not_load_emitters_or_mindspore() -> None:
    """`msgen check` stays fast: no mindspore ever, black and jinja2 only when emitting."""
    report = _modules_after("""
        from msgen.cli import main
        sys.argv = ["msgen", "check", "specs/gpt7b.msl"]
        try:
            result["rc"] = main()
        except SystemExit as exit_:
            result["rc"] = exit_.code
        """)
    assert report["result"]["rc"] in (0, None), report
    assert report["heavy"] == [], f"`msgen check` loaded {report['heavy']}"


def test_compile_loads_no_data_tooling(tmp_path) -> None:
    """`msgen compile` needs jinja2, never MindSpore, tokenizers or pyarrow (those are
    `msgen data`'s alone), nor black: msgen.emit.layout lays the code out as black
    would (tests/test_layout.py)."""
    report = _modules_after(f"""
        from msgen.cli import main
        result["rc"] = main(["compile", "specs/tiny.msl", "-o", {str(tmp_path)!r}])
        """)
    assert report["result"]["rc"] == 0, report
    assert report["heavy"] == ["jinja2"], report
