"""The versions of a host's Ascend software stack: MindSpore, the CANN toolkit, the driver.

One reader for every place that needs them: `msgen doctor` checks them before a launch,
and the generated train.py records them in its run.json. So this module imports the
standard library only, nothing of msgen, has no `from __future__` line and uses
annotations Python 3.9 evaluates: its source can be carried into a generated tree as it
is. Functions take the roots and the environment as arguments; nothing is read at import.

Where the files are, and how they are read, follows the two programs that read them:
- MindSpore 2.10, `mindspore/run_check/_check_version.py` (`AscendEnvChecker`): the CANN
  version is the line `Version=` of `$ASCEND_HOME_PATH/compiler/version.info`, compared
  by its first two fields against the accepted set below; without `ASCEND_HOME_PATH`
  MindSpore skips the check.
- mindformers 2.0.0, `mindformers/run_check.py` (`VersionCheck.check`): the toolkit's
  `<ASCEND_HOME_PATH or /usr/local/Ascend/ascend-toolkit/latest>/<arch>-linux/
  ascend_toolkit_install.info` and the driver's `/usr/local/Ascend/driver/version.info`;
  the published pairing is its `VERSION_MAP.json`.
"""

import os
from typing import Dict, Mapping, Optional

# AscendEnvChecker.version in MindSpore 2.10's run_check/_check_version.py: the CANN
# releases (major.minor) MindSpore 2.10 accepts without a warning.
ACCEPTED_CANN = ("8.2", "8.3", "8.5", "9.0", "9.1")

# mindformers 2.0.0's VERSION_MAP.json, "cann" -> "prefer": the driver published with
# each CANN release of the accepted set.
DRIVER_FOR_CANN = {
    "8.2.RC1": "25.2.0",
    "8.3.RC1": "25.3.RC1",
    "8.5.0": "25.5.0",
    "9.0.0": "26.0.RC1",
    "9.1.0": "26.1.0",
}

# The same file: mindformers 2.0.0 prefers MindSpore 2.10.0 (the release the generated
# code is written for), which prefers CANN 9.1.0.
PUBLISHED = {"mindspore": "2.10.0", "cann": "9.1.0", "driver": DRIVER_FOR_CANN["9.1.0"]}

# mindformers' defaults when ASCEND_HOME_PATH is unset.
DEFAULT_TOOLKIT = "/usr/local/Ascend/ascend-toolkit/latest"
DEFAULT_DRIVER = "/usr/local/Ascend/driver"


def read_info(path: str) -> Dict[str, str]:
    """The `key=value` lines of an Ascend `.info` file, keys as written; {} if unreadable."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read(1 << 16).splitlines()
    except OSError:
        return {}
    out: Dict[str, str] = {}
    for line in lines:
        key, sep, value = line.strip().partition("=")
        if sep and key and key not in out:
            out[key] = value.strip()
    return out


def major_minor(version: str) -> str:
    """`9.1.0` -> `9.1`, `8.0.RC2` -> `8.0`: the fields MindSpore compares."""
    return ".".join(version.split(".")[:2])


def cann_version(environ: Mapping[str, str], machine: str) -> Dict[str, Optional[str]]:
    """The CANN toolkit's version and the file it came from (both None when none is found).

    MindSpore's own file (`compiler/version.info`, line `Version=`) first, since its
    check is the one that warns at run time; then mindformers' `ascend_toolkit_install.info`
    (line `version=`). `machine` is `platform.machine()` (`aarch64`, `x86_64`).
    """
    root = environ.get("ASCEND_HOME_PATH") or DEFAULT_TOOLKIT
    candidates = (
        (os.path.join(root, "compiler", "version.info"), "Version"),
        (os.path.join(root, machine + "-linux", "ascend_toolkit_install.info"), "version"),
    )
    for path, key in candidates:
        value = read_info(path).get(key)
        if value:
            return {"version": value, "source": path}
    return {"version": None, "source": None}


def driver_version(driver_root: str = DEFAULT_DRIVER) -> Dict[str, Optional[str]]:
    """The Ascend driver's version (`Version=` of `<driver_root>/version.info`) and its file."""
    path = os.path.join(driver_root, "version.info")
    value = read_info(path).get("Version")
    return {"version": value or None, "source": path if value else None}


def mindspore_version() -> Optional[str]:
    """The installed MindSpore distribution's version, read without importing it."""
    from importlib import metadata

    try:
        return metadata.version("mindspore")
    except metadata.PackageNotFoundError:
        return None


def stack_versions(
    environ: Mapping[str, str], machine: str, driver_root: str = DEFAULT_DRIVER
) -> Dict[str, Optional[str]]:
    """CANN and driver versions with their files, flat, ready for a JSON record."""
    cann = cann_version(environ, machine)
    driver = driver_version(driver_root)
    return {
        "cann": cann["version"],
        "cann_file": cann["source"],
        "driver": driver["version"],
        "driver_file": driver["source"],
    }


def cann_standing(version: str) -> str:
    """`published` (the pairing mindformers names), `accepted` (MindSpore 2.10 takes it)
    or `outside` (MindSpore warns, and kernels may be missing)."""
    if version == PUBLISHED["cann"]:
        return "published"
    return "accepted" if major_minor(version) in ACCEPTED_CANN else "outside"
