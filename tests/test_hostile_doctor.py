"""`msgen doctor` against hostile tools and environment values: a tool that prints
without end, one that leaves a child in a session of its own holding the pipes, one
whose error output carries terminal escapes, and port variables that are not ports.
Each ends in a doctor line naming the tool or the variable, within the tool's timeout
plus 5 s, in bounded memory, never in a traceback or a silent default.

The tools are the fake host's (tests/doctor_fakes.py) with `npu-smi` replaced.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.doctor_fakes import TINY, FakeHost, by_status, errors

ROOT = Path(__file__).resolve().parents[1]
GRACE_S = 5.0  # doctor returns within a tool's timeout plus this, whatever the tool does


@pytest.fixture
def host(tmp_path) -> FakeHost:
    return FakeHost(tmp_path)


# The doctor of the fake host in its own interpreter, so that its memory can be limited
# and its time measured from outside; prints the doctor's JSON and the seconds taken.
DOCTOR = """
import io, json, resource, sys, time
from contextlib import redirect_stdout
from pathlib import Path
limit = int(sys.argv[4])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from msgen.compiler import analyze
from msgen.doctor.command import DoctorOptions, Host, doctor_command
env = json.loads(sys.argv[2])
spec, root = Path(sys.argv[1]), Path(sys.argv[3])
host = Host(environ=env, machine="aarch64", driver_root=env["FAKE_DRIVER"], tool_timeout=1.0)
options = DoctorOptions(spec, json=True, output=root / "output", tree=root / "tree")
out = io.StringIO()
start = time.monotonic()
with redirect_stdout(out):
    status = doctor_command(analyze(spec), options, host)
print(json.dumps({"status": status, "seconds": time.monotonic() - start,
                  "doc": json.loads(out.getvalue())}))
"""


def doctor_in_a_process(host: FakeHost, limit: int = 1 << 30) -> dict:
    """The doctor of `host` with a 1 s tool timeout under an address-space limit."""
    env = {**host.env, "FAKE_DRIVER": str(host.driver)}
    done = subprocess.run(
        [sys.executable, "-c", DOCTOR, str(TINY), json.dumps(env), str(host.root), str(limit)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    return json.loads(done.stdout)


def npu_error(doc: dict) -> str:
    (check,) = [c for c in doc["checks"] if c["topic"] == "npu" and c["status"] == "error"]
    return check["message"]


def test_a_tool_that_prints_without_end_is_read_to_a_cap(host):
    """`npu-smi` printing for ever (`yes`, some GB a second) under a 1 GiB address
    space: the doctor stops it at the cap, says so, and the other checks go on."""
    host.write(host.bin / "npu-smi", "#!/bin/sh\nexec yes 'npu-smi says this for ever'\n")
    got = doctor_in_a_process(host)
    assert got["status"] == 1 and got["seconds"] < 1.0 + GRACE_S
    assert errors(got["doc"]) == [("npu", None)]
    assert npu_error(got["doc"]) == "`npu-smi info` printed more than 1 MiB: stopped"


def test_a_child_in_its_own_session_does_not_hold_the_doctor(host, tmp_path):
    """`npu-smi` starts a daemon (`setsid`: out of the tool's process group, so the
    kill at the timeout misses it) that keeps the pipes open for a minute, then hangs:
    the doctor stops waiting at the timeout plus the bound, not when the daemon ends."""
    pid_file = tmp_path / "daemon.pid"
    host.write(host.bin / "npu-smi",
               f"#!/bin/sh\nsetsid sleep 60 &\necho $! > {pid_file}\nsleep 60\n")  # fmt: skip
    try:
        got = doctor_in_a_process(host)
    finally:
        if pid_file.is_file():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)  # the daemon this test started
    assert got["status"] == 1 and got["seconds"] < 1.0 + GRACE_S
    assert npu_error(got["doc"]) == "`npu-smi info` did not answer within its timeout"


def test_a_tool_that_exits_leaving_a_daemon_on_its_pipes_is_read(host, tmp_path):
    """A tool that answers and exits 0 but leaves a daemon holding its stdout: its
    answer is read, the doctor does not wait for the daemon."""
    pid_file = tmp_path / "daemon.pid"
    text = (host.tools / "npu-smi.txt").read_text()
    host.write(host.bin / "npu-smi",
               f'#!/bin/sh\ncat "$FAKE_TOOLS/npu-smi.txt"\nsetsid sleep 60 &\necho $! > {pid_file}\n')  # fmt: skip
    assert "healthy" not in text  # the ok line below comes from parsing it
    start = time.monotonic()
    try:
        status, doc = host.doctor(TINY)
    finally:
        if pid_file.is_file():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert time.monotonic() - start < 10.0 + GRACE_S
    assert status == 0, errors(doc)
    (npu,) = [c for c in doc["checks"] if c["topic"] == "npu"]
    assert npu["message"].startswith("devices 0-7 (910B3) healthy and idle")


def test_a_tools_error_output_is_quoted_printably(host, capsys):
    """The last line a failing tool prints on stderr, with terminal escapes in it (a
    title change, a screen clear), is shown with them escaped, in text and JSON."""
    host.write(host.bin / "npu-smi",
               "#!/bin/sh\nprintf 'dcmi error \\033]0;PWNED\\007\\033[2J\\n' >&2\nexit 3\n")  # fmt: skip
    status, doc = host.doctor(TINY)
    assert status == 1
    assert npu_error(doc) == r"`npu-smi info` failed (exit 3): dcmi error \x1b]0;PWNED\x07\x1b[2J"
    from msgen.doctor.command import render_text
    from msgen.doctor.result import Check, Status

    checks = [Check(c["topic"], Status(c["status"]), c["message"]) for c in doc["checks"]]
    assert "\x1b" not in render_text("t", checks)


def port_check(doc: dict) -> list[dict]:
    return [c for c in doc["checks"] if c["topic"] == "port"]


@pytest.mark.parametrize(
    "value, why",
    [
        ("abc", "HCCL_IF_BASE_PORT=abc is not a port number"),
        (
            "9" * 5000,
            "HCCL_IF_BASE_PORT=" + "9" * 20 + "... (5000 characters) is not a port number",
        ),
        ("-1", "HCCL_IF_BASE_PORT=-1 is not a port number"),
        ("0", "HCCL_IF_BASE_PORT=0 is not a port number"),
        ("70000", "HCCL_IF_BASE_PORT=70000 is above 65535"),
        ("65530", "HCCL_IF_BASE_PORT=65530: HCCL takes ports 65530-65561, past 65535"),
        ("6\x1b[2J", r"HCCL_IF_BASE_PORT=6\x1b[2J is not a port number"),
    ],
    ids=["letters", "5000-digits", "negative", "zero", "above", "range-above", "escape"],
)
def test_hccl_base_port_that_is_no_port_is_an_error_naming_it(host, value, why):
    """HCCL_IF_BASE_PORT must be the first of 32 ports (1..65535): anything else is an
    error line naming the variable, not a traceback, not 60000 in its place, and no
    port above 65535 is reported in use."""
    host.env["HCCL_IF_BASE_PORT"] = value
    status, doc = host.doctor(TINY)
    assert status == 1
    (check,) = port_check(doc)
    assert check["status"] == "error" and check["message"].startswith(why), check["message"]
    assert "in use" not in check["message"] and "60000" not in check["message"]


def test_hccl_base_port_near_the_top_lists_only_real_ports():
    """65504 is the last base whose 32 ports end at 65535: it is probed, not refused."""
    from msgen.doctor.network import hccl_port_checks

    (check,) = hccl_port_checks({"HCCL_IF_BASE_PORT": "65504"})
    assert "65504-65535" in check.message and "HCCL_IF_BASE_PORT" not in check.message


@pytest.mark.parametrize("value", ["abc", "9" * 5000, "65536"])
def test_master_port_that_is_no_port_is_an_error_naming_it(host, value):
    """MASTER_PORT replaces the spec's port in the launch scripts as it is: one that is
    no port is an error naming it, not the spec's port silently checked instead."""
    host.env["MASTER_PORT"] = value
    status, doc = host.doctor(TINY)
    assert status == 1
    found = [c for c in by_status(doc, "error") if "MASTER_PORT" in c["message"]]
    assert len(found) == 1 and found[0]["topic"] == "port", doc["checks"]


def test_the_cli_says_it_in_one_line_without_a_traceback(host, tmp_path):
    """The command line as the launch scripts run it, with a hostile base port."""
    env = {**os.environ, **host.env, "HCCL_IF_BASE_PORT": "9" * 5000,
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "msgen.cli", "doctor", str(TINY), "--tree", str(tmp_path / "t"),
         "--output", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "HCCL_IF_BASE_PORT=" in done.stdout
