"""`msgen doctor` on a fake Ascend host (tests/doctor_fakes.py: `npu-smi` and
`hccn_tool` print the formats of Huawei's published references, cited there), for a
healthy host and for one fault at a time; and on this machine, which has no NPU."""

from __future__ import annotations

import io
import json
import os
import socket
import sys
from contextlib import redirect_stdout

import pytest

from msgen.compiler import analyze
from msgen.doctor.command import DoctorOptions, Host, doctor_command
from tests.data_fixtures import NO_PIPELINE
from tests.doctor_fakes import (
    SPEC_IPS,
    SPECS,
    TINY,
    VENV_BIN,
    FakeHost,
    by_status,
    errors,
    free_port,
    hccn_files,
    npu_smi_info,
    ping_reply,
    run_cli,
    spec_variant,
    two_node_spec,
    write_mindrecord,
)


@pytest.fixture
def host(tmp_path) -> FakeHost:
    return FakeHost(tmp_path)


def test_healthy_host_has_no_error_and_no_warning(host):
    status, doc = host.doctor(TINY)
    assert status == 0
    assert errors(doc) == [] and by_status(doc, "warning") == []
    topics = {c["topic"] for c in by_status(doc, "ok")}
    assert {
        "node",
        "mindspore",
        "cann",
        "driver",
        "paths",
        "npu",
        "hccn",
        "port",
        "master",
        "disk",
        "memory",
    } <= topics


@pytest.mark.parametrize(
    "fault, expected",
    [
        ("missing_device", [("npu", 7)]),
        ("busy_device", [("npu", 3)]),
        ("unhealthy_device", [("npu", 1)]),
        ("other_ip", [("hccn", 5)]),
        ("link_down", [("hccn", 2)]),
        ("mixed_tls", [("hccn", None)]),
        ("busy_master_port", [("port", None)]),
        ("busy_hccl_port", [("port", None)]),
        ("cann_outside", [("cann", None)]),
    ],
)
def test_each_fault_gives_exactly_its_error(host, fault, expected):
    held = None
    if fault == "missing_device":
        host.npu_smi(npu_smi_info(devices=range(7)))
    elif fault == "busy_device":
        host.npu_smi(npu_smi_info(processes={3: (124528, "python3.9")}))
    elif fault == "unhealthy_device":
        host.npu_smi(npu_smi_info(health={1: "Alarm"}))
    elif fault == "other_ip":
        host.hccn({"ip_5": "ipaddr:192.98.99.1\nnetmask:255.255.0.0\n"})
    elif fault == "link_down":
        host.hccn({"link_2": "link status: DOWN\n"})
    elif fault == "mixed_tls":
        host.hccn(hccn_files(SPEC_IPS, tls={6: 1}))
    elif fault in ("busy_master_port", "busy_hccl_port"):
        held = socket.socket()
        port = (
            host.env["MASTER_PORT"]
            if fault == "busy_master_port"
            else host.env["HCCL_IF_BASE_PORT"]
        )
        held.bind(("127.0.0.1", int(port) + (7 if fault == "busy_hccl_port" else 0)))
        held.listen()
    elif fault == "cann_outside":
        host.cann("8.0.RC2")
    try:
        status, doc = host.doctor(TINY)
    finally:
        if held:
            held.close()
    assert status == 1
    assert errors(doc) == expected, by_status(doc, "error")
    assert all(c.get("fix") for c in by_status(doc, "error"))


def test_the_error_names_what_is_wrong(host):
    host.hccn({"ip_5": "ipaddr:192.98.99.1\nnetmask:255.255.0.0\n"})
    host.hccn({"link_2": "link status: DOWN\n"})
    host.hccn(
        {
            "tls_6": "dev_id:6, tls switch[1](0:disable, 1:enable), tls alarm time threshold[60]days\n"
        }
    )
    _, doc = host.doctor(TINY)
    messages = [c["message"] for c in by_status(doc, "error")]
    assert messages == [
        "device 2: link is DOWN",
        "device 5 has address 192.98.99.1; the spec's device_ips give 192.98.15.1",
        "TLS is on for devices 6 and off for 0, 1, 2, 3, 4, 5, 7",
    ]


def test_cann_inside_the_set_but_not_the_pairing_is_a_warning(host):
    host.cann("8.5.0")
    status, doc = host.doctor(TINY)
    assert status == 0 and errors(doc) == []
    warned = [(c["topic"], c["message"]) for c in by_status(doc, "warning")]
    assert [t for t, _ in warned] == ["cann", "driver"]  # and 26.1.0 is not 8.5.0's driver (25.5.0)
    assert "25.5.0" in warned[1][1]


def test_subnet_rule_of_the_910b_is_a_warning(host):
    host.hccn(hccn_files(SPEC_IPS, netmask="255.255.255.0"))  # each device its own /24
    status, doc = host.doctor(TINY)
    assert status == 0
    assert [c["topic"] for c in by_status(doc, "warning")] == ["hccn"]


@pytest.mark.parametrize(
    "netmask, expected", [("255.255.255.0", []), ("255.255.0.0", [1, 2, 3, 5, 6, 7])]
)
def test_subnet_rule_of_the_910a_is_an_error(host, tmp_path, netmask, expected):
    # Atlas 800 (910A): 0/4, 1/5, 2/6, 3/7 share a subnet; 0-3 each a different one.
    ips = [f"10.0.{d % 4}.{1 + d // 4}" for d in range(8)]
    listed = ", ".join(f'"{ip}"' for ip in ips)
    spec = spec_variant(
        tmp_path, "a",
        ("ascend910b", "ascend910a"),
        ('device_ips = hccn("hccn.conf")', f"device_ips = [{listed}]"),
    )  # fmt: skip
    host.hccn(hccn_files(ips, netmask=netmask))
    status, doc = host.doctor(spec)
    assert errors(doc) == [("hccn", d) for d in expected]
    assert status == (1 if expected else 0)


def test_peers_ping_the_same_device_on_the_other_node(host, tmp_path):
    spec = two_node_spec(tmp_path)
    host.npu_smi(npu_smi_info(devices=range(4)))
    for d in range(4):
        host.hccn({f"ping_{d}_192.99.{10 + d}.2": ping_reply(d, f"192.99.{10 + d}.2")})
    host.hccn({"ping_1_192.99.11.2": ping_reply(1, "192.99.11.2", received=0)})
    status, doc = host.doctor(spec, peers=True)
    assert status == 1
    assert errors(doc) == [("peers", 1)]
    assert "192.99.11.2" in by_status(doc, "error")[0]["message"]


def test_no_npu_smi_skips_every_ascend_check_with_its_reason(tmp_path):
    host = FakeHost(tmp_path, ascend=False)
    status, doc = host.doctor(TINY, peers=True)
    assert status == 0, by_status(doc, "error")
    skips = {c["topic"]: c["message"] for c in by_status(doc, "skipped")}
    for topic in ("cann", "driver", "paths", "npu", "hccn", "port", "peers"):
        assert skips[topic] == "npu-smi not found (not an Ascend host)"


def test_a_missing_data_file_is_an_error_where_train_py_would_look(host, tmp_path):
    spec = spec_variant(
        tmp_path, "data", ("seed         = 1234", 'data = mindrecord("data/train.mindrecord")')
    )
    tree = tmp_path / "tree"
    status, doc = host.doctor(spec, tree=tree)
    assert status == 1
    assert errors(doc) == [("data", None)]
    assert str(tree / "data" / "train.mindrecord") in by_status(doc, "error")[0]["message"]


def test_node_is_taken_from_this_hosts_address(host, tmp_path):
    spec = two_node_spec(tmp_path)
    host.npu_smi(npu_smi_info(devices=range(4)))
    _, doc = host.doctor(spec)
    assert doc["node"] == 0
    host.hccn({f"ip_{d}": f"ipaddr:192.99.{10 + d}.2\nnetmask:255.255.0.0\n" for d in range(4)})
    status, doc = host.doctor(spec, node=1)
    assert doc["node"] == 1 and errors(doc) == []  # node 1's addresses, not node 0's


def test_data_is_read_as_train_py_reads_it(host, tmp_path):
    """A MindRecord of seq + 1 ids with its dataset.json passes; one of seq ids without a
    dataset.json fails on its first sample; a dataset.json for another seq fails."""
    spec = spec_variant(
        tmp_path, "data",
        ("seed         = 1234", 'data = mindrecord("train.mindrecord", valid = "v/valid.mindrecord")'),
        *NO_PIPELINE,  # a validation set needs pp = 1 (MSL514)
    )  # fmt: skip
    run = tmp_path / "run"
    write_mindrecord(run / "train.mindrecord", 33)
    (run / "dataset.json").write_text(json.dumps({"vocab": 256, "seq": 32}))
    write_mindrecord(run / "v" / "valid.mindrecord", 32)
    status, doc = host.doctor(spec, run_from=run)
    assert status == 1
    data = [(c["status"], c["message"]) for c in doc["checks"] if c["topic"] == "data"]
    assert data == [
        ("ok", f"train data {run / 'train.mindrecord'}: MindRecord, 33 ids a sample"),
        (
            "error",
            f"{run / 'v' / 'valid.mindrecord'}: samples have 32 ids; the spec's seq + 1 is 33",
        ),
    ]
    (run / "v" / "dataset.json").write_text(json.dumps({"vocab": 256, "seq": 31}))
    _, doc = host.doctor(spec, run_from=run)
    assert [c["message"] for c in by_status(doc, "error")] == [
        f"{run / 'v' / 'dataset.json'}: made for vocab=256, seq=31; the spec has vocab=256, seq=32"
    ]


def test_a_dataset_json_names_its_files(host, tmp_path):
    """A spec's path to a dataset.json: the set's listed files are checked (the first
    read, all there); a listed file that is missing is the error, named."""
    spec = spec_variant(
        tmp_path, "data",
        ("seed         = 1234", 'data = mindrecord("d/dataset.json")'),
    )  # fmt: skip
    run = tmp_path / "run"
    files = ["train-00000.mindrecord", "train-00001.mindrecord"]
    for name in files:
        write_mindrecord(run / "d" / name, 33)
    meta = {"vocab": 256, "seq": 32, "files": {"train": files}}
    (run / "d" / "dataset.json").write_text(json.dumps(meta))
    status, doc = host.doctor(spec, run_from=run)
    data = [(c["status"], c["message"]) for c in doc["checks"] if c["topic"] == "data"]
    assert data == [("ok", f"train data {run / 'd' / files[0]}: MindRecord, 33 ids a sample")]
    (run / "d" / files[1]).unlink()
    _, doc = host.doctor(spec, run_from=run)
    assert [c["message"] for c in by_status(doc, "error")] == [
        f"{run / 'd' / files[1]}: listed in {run / 'd' / 'dataset.json'} and missing (1 of 2)"
    ]


def test_not_a_mindrecord(host, tmp_path):
    spec = spec_variant(
        tmp_path, "data", ("seed         = 1234", 'data = mindrecord("t.mindrecord")')
    )
    (tmp_path / "t.mindrecord").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    _, doc = host.doctor(spec, run_from=tmp_path)
    assert [c["message"] for c in by_status(doc, "error")] == [
        f"{tmp_path / 't.mindrecord'} is not a MindRecord file"
    ]


@pytest.mark.parametrize("spec", sorted(SPECS.glob("*.msl")), ids=lambda p: p.name)
def test_every_spec_runs_on_this_machine(spec, tmp_path):
    """No NPU here: the command runs, skips the Ascend checks with their reason, and
    checks the interpreter, the master, the disk, the data and the memory."""
    import subprocess

    env = {**os.environ, "PATH": os.pathsep.join([VENV_BIN, "/usr/bin", "/bin"])}
    env.pop("MASTER_ADDR", None)
    env["MASTER_PORT"] = str(free_port())
    out = subprocess.run(
        [sys.executable, "-m", "msgen.cli", "doctor", str(spec), "--json", "--output", str(tmp_path / "o")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert out.returncode in (0, 1), out.stderr
    assert "Traceback" not in out.stderr
    doc = json.loads(out.stdout)
    status = {c["topic"]: c["status"] for c in doc["checks"]}
    for topic in ("cann", "driver", "paths", "npu", "hccn", "port"):
        assert status[topic] == "skipped"
    assert {status[t] for t in ("mindspore", "disk", "memory")} <= {"ok", "warning", "error"}
    assert status["master"] in ("ok", "error")  # error: the spec's master is not this host
    assert out.returncode == (1 if doc["error"] else 0)


def test_usage_and_spec_errors(tmp_path):
    status, _, err = run_cli(str(TINY), "--node", "1")
    assert status == 2 and err == "msgen: error: --node 1: the spec has nodes 0 to 0\n"
    broken = tmp_path / "broken.msl"
    broken.write_text(TINY.read_text().replace("tp = 2", "tp = 3"))
    status, out, err = run_cli(str(broken))
    assert status == 1 and out == "" and "error[MSL" in err
    # the launch scripts' call: a spec with errors is not the one the tree was compiled from
    status, out, err = run_cli(str(broken), "--compiled-from", "ab" * 32)
    assert status == 0 and out == ""
    assert err.endswith("is not the spec this tree was compiled from (its sha256 differs)\n")


HANGS = '#!/bin/sh\nsleep 30\ncat "$FAKE_TOOLS/npu-smi.txt"\n'


def test_a_tool_that_hangs_is_stopped_at_its_timeout(host, tmp_path, monkeypatch):
    """npu-smi and a --peers ping that never answer: each is an error at its timeout,
    not a wait (a script's sleeping child is stopped with it)."""
    import msgen.doctor.hccn

    host.write(host.bin / "npu-smi", HANGS)
    spec = two_node_spec(tmp_path)
    host.hccn(
        {f"ping_{d}_192.99.{10 + d}.2": ping_reply(d, f"192.99.{10 + d}.2") for d in range(4)}
    )
    hccn_tool = (host.bin / "hccn_tool").read_text()
    host.write(
        host.bin / "hccn_tool",
        hccn_tool.replace('cat "$file"', '[ "$op" = ping ] && sleep 30\ncat "$file"'),
    )
    monkeypatch.setattr(msgen.doctor.hccn, "PING_TIMEOUT_S", 0.5)
    result = analyze(spec)
    out = io.StringIO()
    host_ = Host(
        environ=host.env, machine="aarch64", driver_root=str(host.driver), tool_timeout=0.5
    )
    opts = DoctorOptions(spec, json=True, peers=True, output=tmp_path / "o", tree=tmp_path / "t")
    with redirect_stdout(out):
        status = doctor_command(result, opts, host_)
    doc = json.loads(out.getvalue())
    assert status == 1
    assert errors(doc) == [("npu", None), ("peers", 0), ("peers", 1), ("peers", 2), ("peers", 3)]
    assert (
        by_status(doc, "error")[0]["message"] == "`npu-smi info` did not answer within its timeout"
    )


def test_master_addr_and_port_from_the_environment_as_the_launch_scripts_take_them():
    from msgen.doctor.network import master, master_checks

    nodes = ("192.0.2.10", "192.0.2.11")  # TEST-NET-1: never this host's
    assert master({}, nodes, 8118) == ("192.0.2.10", 8118)
    assert master({"MASTER_ADDR": "", "MASTER_PORT": ""}, nodes, 8118) == ("192.0.2.10", 8118)
    port = free_port()
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    assert [c.status.value for c in master_checks(env, nodes, 8118, 0)] == ["ok"]
    (found,) = master_checks({"MASTER_PORT": str(port)}, nodes, 8118, 0)
    assert found.status.value == "error"
    assert found.message.startswith("node 0 must own the master address 192.0.2.10")
    # another node does not start the scheduler: nothing to own
    assert [c.status.value for c in master_checks({}, nodes, 8118, 1)] == ["ok"]


def test_the_interpreter_msrun_starts_is_the_one_checked(tmp_path):
    """msrun starts `python` from PATH: a python without MindSpore first on PATH is an
    error even though msgen's own interpreter has it; no msrun is a warning."""
    host = FakeHost(tmp_path, ascend=False)
    (host.bin / "python").symlink_to("/usr/bin/python3")  # the system one: no MindSpore
    status, doc = host.doctor(TINY)
    assert status == 1
    assert errors(doc) == [("python", None)]
    assert "cannot import mindspore" in by_status(doc, "error")[0]["message"]
    (tmp_path / "no_msrun").mkdir()
    host = FakeHost(tmp_path / "no_msrun", ascend=False)
    host.env["PATH"] = os.pathsep.join([str(host.bin), "/usr/bin", "/bin"])
    python = f'#!/bin/sh\nexec {VENV_BIN}/python "$@"\n'  # the venv's, without its msrun
    host.write(host.bin / "python", python).chmod(0o755)
    status, doc = host.doctor(TINY)
    assert status == 0 and errors(doc) == []
    assert [c["topic"] for c in by_status(doc, "warning")] == ["python"]
