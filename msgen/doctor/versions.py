"""The software stack: MindSpore in the interpreter msrun starts, the CANN toolkit and
the driver (read by msgen.hostinfo, the reader run.json uses too), and the Ascend
paths MindSpore looks for at import.

msrun starts its workers with the `python` found on PATH (MindSpore 2.10,
parallel/cluster/process_entity/_utils.py, `_generate_cmd_args_list`), not with the
interpreter msrun itself runs in: that is the one checked.
"""

from __future__ import annotations

from collections.abc import Mapping

from msgen import hostinfo
from msgen.doctor.result import Check, error, ok, skipped, warning
from msgen.doctor.tools import Tools

# Run in the worker interpreter: finds MindSpore without importing it (fast).
PROBE = (
    "import importlib.metadata as m, importlib.util as u, sys\n"
    "print(sys.executable)\n"
    "print(m.version('mindspore') if u.find_spec('mindspore') else '')\n"
)
PROBE_TIMEOUT_S = 60.0


def interpreter_checks(tools: Tools) -> list[Check]:
    """`python` on PATH exists and has MindSpore of the version the code is for."""
    target = hostinfo.PUBLISHED["mindspore"]
    if tools.which("msrun") is None:
        # launch/rank_table.sh starts python itself: only launch/msrun.sh needs msrun
        found = [warning("python", "msrun is not on PATH: launch/msrun.sh cannot start",
                         "activate the environment MindSpore is installed in (msrun comes "
                         "with it), or launch with launch/rank_table.sh")]  # fmt: skip
    else:
        found = []
    out = tools.run("python", "-c", PROBE, timeout=PROBE_TIMEOUT_S)
    if out is None:
        return found + [error("python", "no `python` on PATH: msrun starts its workers with it",
                              "activate the environment that has MindSpore, or link python to its interpreter")]  # fmt: skip
    if out.failure():
        return found + [error("python", out.failure(), "check the `python` on PATH")]
    lines = out.stdout.splitlines() + ["", ""]
    executable, version = lines[0], lines[1].strip()
    if not version:
        return found + [error("python", f"{executable} (the `python` msrun will start) cannot import mindspore",
                              f"install mindspore=={target} there, or put the interpreter that has it "
                              "first on PATH")]  # fmt: skip
    if hostinfo.major_minor(version) != hostinfo.major_minor(target):
        return found + [error("mindspore", f"{executable} has MindSpore {version}; the generated code is for {target}",
                              f"pip install mindspore=={target}")]  # fmt: skip
    if version != target:
        return found + [warning("mindspore", f"{executable} has MindSpore {version}; the generated code is for {target}",
                                f"pip install mindspore=={target}")]  # fmt: skip
    return found + [ok("mindspore", f"MindSpore {version} in {executable}")]


def stack_checks(environ: Mapping[str, str], machine: str, driver_root: str) -> list[Check]:
    """CANN against MindSpore 2.10's accepted set and mindformers' pairing; the driver
    against the pairing for that CANN."""
    found: list[Check] = []
    cann = hostinfo.cann_version(environ, machine)
    version = cann["version"]
    if version is None:
        found.append(error("cann", "no CANN toolkit found (no compiler/version.info or "
                           "ascend_toolkit_install.info under ASCEND_HOME_PATH or the default path)",
                           "install the CANN toolkit and `source <toolkit>/set_env.sh`"))  # fmt: skip
    else:
        standing = hostinfo.cann_standing(version)
        accepted = ", ".join(hostinfo.ACCEPTED_CANN)
        published = hostinfo.PUBLISHED["cann"]
        if standing == "outside":
            found.append(error("cann", f"CANN {version} ({cann['source']}) is outside the set MindSpore "
                               f"{hostinfo.PUBLISHED['mindspore']} accepts ({accepted})",
                               f"install CANN {published}"))  # fmt: skip
        elif standing == "accepted":
            found.append(warning("cann", f"CANN {version} is accepted, but the published pairing is "
                                 f"CANN {published}", f"install CANN {published} for the tested stack"))  # fmt: skip
        else:
            found.append(ok("cann", f"CANN {version} ({cann['source']})"))
    driver = hostinfo.driver_version(driver_root)
    if driver["version"] is None:
        found.append(error("driver", f"no driver version in {driver_root}/version.info",
                           "install the Ascend driver (npu-smi is here, its version file is not)"))  # fmt: skip
    else:
        paired = hostinfo.DRIVER_FOR_CANN.get(version or "")
        if paired and driver["version"] != paired:
            found.append(warning("driver", f"driver {driver['version']}; CANN {version} is published "
                                 f"with driver {paired}", f"install driver {paired}"))  # fmt: skip
        else:
            found.append(ok("driver", f"driver {driver['version']}"))
    return found


# What MindSpore 2.10's AscendEnvChecker._check_env looks for in each variable.
ASCEND_PATHS = (
    ("PYTHONPATH", "opp/built-in/op_impl/ai_core/tbe", "the TBE operator implementation"),
    ("LD_LIBRARY_PATH", "/lib64", "the driver's libraries"),
    ("ASCEND_OPP_PATH", "/opp", "the operator package"),
)


def path_checks(environ: Mapping[str, str]) -> list[Check]:
    found = []
    for name, part, what in ASCEND_PATHS:
        if part not in environ.get(name, ""):
            found.append(warning("paths", f"{name} has no entry with {part} ({what}): MindSpore will warn "
                                 "and may not find it", "source <toolkit>/set_env.sh in the launch environment"))  # fmt: skip
    return found or [
        ok("paths", "PYTHONPATH, LD_LIBRARY_PATH and ASCEND_OPP_PATH as MindSpore expects")
    ]


def no_npu(topic: str) -> Check:
    return skipped(topic, "npu-smi not found (not an Ascend host)")
