"""The one reader of the MindSpore, CANN and driver versions (msgen/hostinfo.py).

The fake files below have the layouts the two readers of them expect: MindSpore 2.10's
run_check/_check_version.py reads the `Version=` line of
`$ASCEND_HOME_PATH/compiler/version.info`; mindformers 2.0.0's run_check.py reads
`<toolkit>/<arch>-linux/ascend_toolkit_install.info` and the driver's `version.info`.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

from msgen import hostinfo

SOURCE = Path(hostinfo.__file__)

COMPILER_INFO = "Version=9.1.0\nversion_dir=9.1.0\ntimestamp=20260105_000000\n"
TOOLKIT_INFO = (
    "package_name=Ascend-cann-toolkit\nversion=8.5.0\ninnerversion=V100R001C25B090\n"
    "arch=aarch64\nos=linux\npath=/usr/local/Ascend/ascend-toolkit/8.5.0/aarch64-linux\n"
)
DRIVER_INFO = (
    "Version=26.1.0\nascendhal_version=7.35.23\naicpu_version=1.0\n"
    "compatible_version=[V100R001C15],[V100R001C18]\npackage_version=26.1.0\n"
)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_cann_from_mindspores_own_file_first(tmp_path):
    write(tmp_path / "compiler" / "version.info", COMPILER_INFO)
    write(tmp_path / "aarch64-linux" / "ascend_toolkit_install.info", TOOLKIT_INFO)
    got = hostinfo.cann_version({"ASCEND_HOME_PATH": str(tmp_path)}, "aarch64")
    assert got == {"version": "9.1.0", "source": str(tmp_path / "compiler" / "version.info")}


def test_cann_from_toolkit_install_info_when_compiler_file_is_absent(tmp_path):
    write(tmp_path / "x86_64-linux" / "ascend_toolkit_install.info", TOOLKIT_INFO)
    env = {"ASCEND_HOME_PATH": str(tmp_path)}
    assert hostinfo.cann_version(env, "x86_64")["version"] == "8.5.0"
    # another architecture's folder is not this host's toolkit
    assert hostinfo.cann_version(env, "aarch64") == {"version": None, "source": None}


def test_no_files_no_versions(tmp_path):
    assert hostinfo.stack_versions(
        {"ASCEND_HOME_PATH": str(tmp_path)}, "aarch64", str(tmp_path)
    ) == {
        "cann": None,
        "cann_file": None,
        "driver": None,
        "driver_file": None,
    }


def test_driver_version(tmp_path):
    write(tmp_path / "driver" / "version.info", DRIVER_INFO)
    assert hostinfo.driver_version(str(tmp_path / "driver")) == {
        "version": "26.1.0",
        "source": str(tmp_path / "driver" / "version.info"),
    }


def test_a_file_without_the_line_gives_none(tmp_path):
    write(tmp_path / "compiler" / "version.info", "version_dir=9.1.0\n")
    write(tmp_path / "driver" / "version.info", "package_version=26.1.0\n")
    got = hostinfo.stack_versions(
        {"ASCEND_HOME_PATH": str(tmp_path)}, "x", str(tmp_path / "driver")
    )
    assert got["cann"] is None and got["driver"] is None


@pytest.mark.parametrize(
    "version, standing",
    [
        ("9.1.0", "published"),
        ("9.1.RC1", "accepted"),
        ("8.2.RC1", "accepted"),
        ("8.5.0", "accepted"),
        ("9.0.0", "accepted"),
        ("8.0.RC2", "outside"),
        ("8.1.RC1", "outside"),
        ("7.0.0", "outside"),
        ("10.0.0", "outside"),
    ],
)
def test_standing_against_mindspore_and_mindformers_tables(version, standing):
    # accepted: AscendEnvChecker.version = ["8.2", "8.3", "8.5", "9.0", "9.1"];
    # published: VERSION_MAP.json ms 2.10.0 -> cann 9.1.0 -> driver 26.1.0
    assert hostinfo.cann_standing(version) == standing


def test_the_module_can_be_carried_into_a_generated_tree(tmp_path):
    """Stdlib only, no msgen import, parses as Python 3.9 and runs loaded from a copy."""
    tree = ast.parse(SOURCE.read_text(encoding="utf-8"), feature_version=(3, 9))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0 and node.module != "__future__"
            imported.add(node.module.split(".")[0])
    assert imported <= sys.stdlib_module_names, imported - sys.stdlib_module_names
    copy = write(tmp_path / "tree" / "hostinfo.py", SOURCE.read_text(encoding="utf-8"))
    spec = importlib.util.spec_from_file_location("carried_hostinfo", copy)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    write(tmp_path / "d" / "version.info", DRIVER_INFO)
    assert module.driver_version(str(tmp_path / "d"))["version"] == "26.1.0"


def test_mindspore_version_without_importing_it():
    before = "mindspore" in sys.modules
    assert hostinfo.mindspore_version() == "2.10.0"
    assert ("mindspore" in sys.modules) == before
