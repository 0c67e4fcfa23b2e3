"""A fake Ascend host for `msgen doctor`'s tests: `npu-smi` and `hccn_tool` on PATH are
scripts that print what the real tools print, and the version files sit in a tmp folder.

The formats are Huawei's:
- `npu-smi info`: Ascend HDK "npu-smi Command Reference", "info" (query all devices):
  a title block, two rows per chip (`NPU Name | Health | Power(W) Temp(C)
  Hugepages-Usage(page)` and `Chip | Bus-Id | AICore(%) Memory-Usage(MB)
  HBM-Usage(MB)`), then the process table (`NPU Chip | Process id | Process name |
  Process memory(MB)` or `No running processes found in NPU N`); the rows below are an
  Atlas 800T A2's (910B3), laid out as that reference shows them.
- `hccn_tool`: Ascend HDK "HCCN Tool Interface Reference": `-i N -ip -g` prints
  `ipaddr:` and `netmask:` lines; `-i N -link -g` prints `link status: UP`;
  `-i N -tls -g` ("Querying the TLS Certificate Information of an NPU Device") prints
  `dev_id:N, tls switch[0](0:disable, 1:enable), tls preconfigured[1](0:non-preset,
  1:preset), tls alarm time threshold[60]days`; `-i N -ping -g address A` prints a line
  per probe (`recv seq=0,time=...` or `recv time out seq=0`) and ends with
  `3 packets transmitted, 3 received, 0.00% packet loss`.
- The CANN and driver version files: MindSpore 2.10's run_check/_check_version.py reads
  `Version=` of `$ASCEND_HOME_PATH/compiler/version.info`; mindformers 2.0.0's
  run_check.py reads `<driver>/version.info`.
"""

from __future__ import annotations

import io
import json
import os
import socket
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

from msgen.compiler import analyze
from msgen.doctor.command import DoctorOptions, Host, doctor_command

REPO = Path(__file__).resolve().parent.parent
SPECS = REPO / "specs"
TINY = SPECS / "tiny.msl"
VENV_BIN = str(Path(sys.executable).parent)  # python with MindSpore, and msrun

ROW_SEP = "+===========================+===============+====================================================+"


def npu_smi_info(devices=range(8), health=None, processes=None) -> str:
    """`npu-smi info` of an Atlas 800T A2 (one chip per NPU)."""
    health = health or {}
    processes = processes or {}
    out = [
        "+------------------------------------------------------------------------------------------------+",
        "| npu-smi 24.1.0                   Version: 24.1.0                                               |",
        "+---------------------------+---------------+----------------------------------------------------+",
        "| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|",
        "| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |",
        ROW_SEP,
    ]
    for d in devices:
        out.append(
            f"| {d:<5} {'910B3':<19} | {health.get(d, 'OK'):<13} | 92.1        38                0    / 0             |"
        )
        out.append(
            f"| {0:<25} | 0000:{0xC1 + d:02X}:00.0  | 0           0    / 0          3391 / 65536         |"
        )
        out.append(ROW_SEP)
    out.append(
        "+---------------------------+---------------+----------------------------------------------------+"
    )
    out.append(
        "| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |"
    )
    out.append(ROW_SEP)
    for d in devices:
        if d in processes:
            pid, name = processes[d]
            out.append(f"| {d:<7} {0:<17} | {pid:<13} | {name:<24} | 17400                   |")
        else:
            out.append(f"| No running processes found in NPU {d:<61}|")
        out.append(ROW_SEP)
    return "\n".join(out) + "\n"


# The spec's addresses (specs/hccn.conf): 192.98.1<d>.1; a /16 puts them in one subnet.
def hccn_files(ips, netmask="255.255.0.0", link=None, tls=None) -> dict[str, str]:
    link, tls = link or {}, tls or {}
    files = {}
    for d, ip in enumerate(ips):
        files[f"ip_{d}"] = f"ipaddr:{ip}\nnetmask:{netmask}\n"
        files[f"link_{d}"] = f"link status: {link.get(d, 'UP')}\n"
        files[f"tls_{d}"] = (
            f"dev_id:{d}, tls switch[{tls.get(d, 0)}](0:disable, 1:enable), tls preconfigured[1]"
            "(0:non-preset, 1:preset), tls alarm time threshold[60]days\n"
            f"dev_id:{d}, [pub cert] info:\n         issuer[/C=CN/ST=GD/O=HUAWEI/OU=2012/CN=2_1thCA]\n"
        )
    return files


def ping_reply(device: int, address: str, received: int = 3) -> str:
    lines = [f"device {device} PING {address}"]
    lines += [f"recv seq={i},time=0.03{i}000ms" for i in range(received)]
    lines += [f"recv time out seq={i}" for i in range(received, 3)]
    loss = 100 * (3 - received) / 3
    lines.append(f"3 packets transmitted, {received} received, {loss:.2f}% packet loss")
    return "\n".join(lines) + "\n"


NPU_SMI = '#!/bin/sh\n[ "$1" = info ] || exit 2\ncat "$FAKE_TOOLS/npu-smi.txt"\n'
# hccn_tool -i N -ip|-link|-tls -g ; hccn_tool -i N -ping -g address A
HCCN_TOOL = r"""#!/bin/sh
dev=$2
op=${3#-}
if [ "$op" = ping ]; then file="$FAKE_TOOLS/hccn/ping_${dev}_$6"; else file="$FAKE_TOOLS/hccn/${op}_$dev"; fi
[ -f "$file" ] || { echo "hccn_tool: cannot get $op of device $dev" >&2; exit 1; }
cat "$file"
"""

SPEC_IPS = tuple(f"192.98.{10 + d}.1" for d in range(8))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_range(n: int = 32) -> int:
    """A base port with n free ports after it (for HCCL_IF_BASE_PORT)."""
    for base in range(41000, 49000, 64):
        try:
            socks = []
            for p in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


class FakeHost:
    """A tmp folder with fake tools, version files and an environment."""

    def __init__(self, root: Path, ascend: bool = True):
        self.root = root
        self.bin = root / "bin"
        self.bin.mkdir()
        self.tools = root / "tools"
        (self.tools / "hccn").mkdir(parents=True)
        self.toolkit = root / "toolkit"
        self.driver = root / "driver"
        self.env = {
            "PATH": os.pathsep.join([str(self.bin), VENV_BIN, "/usr/bin", "/bin"]),
            "FAKE_TOOLS": str(self.tools),
            "ASCEND_HOME_PATH": str(self.toolkit),
            "PYTHONPATH": str(self.toolkit / "opp/built-in/op_impl/ai_core/tbe"),
            "LD_LIBRARY_PATH": str(self.driver / "lib64"),
            "ASCEND_OPP_PATH": str(self.toolkit / "opp"),
            "MASTER_PORT": str(free_port()),
            "HCCL_IF_BASE_PORT": str(free_range()),
        }
        self.cann("9.1.0")
        self.write(self.driver / "version.info", "Version=26.1.0\npackage_version=26.1.0\n")
        if ascend:
            for name, text in (("npu-smi", NPU_SMI), ("hccn_tool", HCCN_TOOL)):
                self.write(self.bin / name, text).chmod(0o755)
            self.npu_smi(npu_smi_info())
            self.hccn(hccn_files(SPEC_IPS))

    @staticmethod
    def write(path: Path, text: str) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def cann(self, version: str) -> None:
        self.write(self.toolkit / "compiler" / "version.info", f"Version={version}\n")

    def npu_smi(self, text: str) -> None:
        self.write(self.tools / "npu-smi.txt", text)

    def hccn(self, files: dict[str, str]) -> None:
        for name, text in files.items():
            self.write(self.tools / "hccn" / name, text)

    def doctor(self, spec: Path, *sets: str, **options) -> tuple[int, dict]:
        result = analyze(spec, list(sets))
        assert result.ok, result.diagnostics
        options.setdefault("output", self.root / "output")
        options.setdefault("tree", self.root / "tree")
        opts = DoctorOptions(spec, json=True, **options)
        host = Host(environ=self.env, machine="aarch64", driver_root=str(self.driver))
        out = io.StringIO()
        with redirect_stdout(out):
            status = doctor_command(result, opts, host)
        return status, json.loads(out.getvalue())


def errors(doc: dict) -> list[tuple[str, int | None]]:
    return [(c["topic"], c.get("device")) for c in doc["checks"] if c["status"] == "error"]


def by_status(doc: dict, status: str) -> list[dict]:
    return [c for c in doc["checks"] if c["status"] == status]


def spec_variant(tmp_path: Path, name: str, *edits: tuple[str, str]) -> Path:
    """specs/tiny.msl with text replaced, beside a copy of its hccn.conf."""
    spec = tmp_path / "spec" / f"{name}.msl"
    spec.parent.mkdir(exist_ok=True)
    (spec.parent / "hccn.conf").write_text((SPECS / "hccn.conf").read_text())
    text = TINY.read_text()
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    spec.write_text(text)
    return spec


def two_node_spec(tmp_path: Path) -> Path:
    node0 = ", ".join(f'"{ip}"' for ip in SPEC_IPS[:4])
    node1 = ", ".join(f'"192.99.{10 + d}.2"' for d in range(4))
    return spec_variant(
        tmp_path, "two",
        ("per_node   = 8", "per_node   = 4"),
        ('nodes      = ["127.0.0.1"]', 'nodes      = ["127.0.0.1", "192.0.2.11"]'),
        ('device_ips = hccn("hccn.conf")', f"device_ips = [[{node0}], [{node1}]]"),
    )  # fmt: skip


def write_mindrecord(path: Path, length: int, rows: int = 8) -> None:
    import numpy as np
    from mindspore.mindrecord import FileWriter

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = FileWriter(str(path), shard_num=1)
    writer.add_schema({"input_ids": {"type": "int32", "shape": [-1]}}, "tokens")
    writer.write_raw_data(
        [{"input_ids": np.arange(length, dtype=np.int32) + i} for i in range(rows)]
    )
    writer.commit()


def run_cli(*args: str) -> tuple[int, str, str]:
    from msgen.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(["doctor", *args])
    return status, out.getvalue(), err.getvalue()
