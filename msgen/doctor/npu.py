"""The NPUs as `npu-smi info` shows them: present, healthy, and not in use.

The table's layout is Huawei's (Ascend HDK "npu-smi Command Reference", "info"): a
block of two rows per chip (`NPU Name | Health | Power Temp Hugepages`, then
`Chip [Device] | Bus-Id | AICore Memory HBM`), then the process table (`NPU Chip |
Process id | Process name | Process memory(MB)`, or `No running processes found in NPU
N`). On one-chip NPUs (Atlas 800T A2) the NPU ID is the logical device ID that
DEVICE_ID and `hccn_tool -i` take; where the second row has a Device column, that is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from msgen.doctor.result import Check, error, ok, warning
from msgen.doctor.tools import Output

BUS_ID = re.compile(r"^[0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:")


@dataclass
class Npu:
    npu: int
    chip: int
    device: int
    name: str
    health: str
    processes: list[tuple[int, str]] = field(default_factory=list)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def parse_info(text: str) -> list[Npu]:
    """The chips of `npu-smi info` with their processes, in the order listed."""
    chips: list[Npu] = []
    section, device_column, pending = None, False, None
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        cells = _cells(line)
        head = " ".join(cells[0].split())
        if head.startswith("NPU") and len(cells) > 1 and cells[1].startswith("Health"):
            section = "chips"
            continue
        if head.startswith("Chip") and section == "chips":
            device_column = "Device" in head
            continue
        if head.startswith("NPU") and len(cells) > 1 and cells[1].startswith("Process id"):
            section = "processes"
            continue
        words = cells[0].split()
        if section == "chips" and len(cells) >= 2:
            if words and words[0].isdigit() and not BUS_ID.match(cells[1]):
                pending = (
                    int(words[0]),
                    " ".join(words[1:]),
                    cells[1].split()[0] if cells[1] else "",
                )
            elif pending and BUS_ID.match(cells[1]) and words and words[0].isdigit():
                npu, name, health = pending
                chip = int(words[0])
                device = (
                    int(words[1])
                    if device_column and len(words) > 1 and words[1].isdigit()
                    else npu
                )
                chips.append(Npu(npu, chip, device, name, health))
                pending = None
        elif section == "processes" and len(cells) >= 3 and len(words) >= 2:
            if words[0].isdigit() and words[1].isdigit() and cells[1].isdigit():
                npu, chip = int(words[0]), int(words[1])
                for c in chips:
                    if (c.npu, c.chip) == (npu, chip):
                        c.processes.append((int(cells[1]), cells[2]))
    return chips


def npu_checks(out: Output, per_node: int) -> list[Check]:
    """The spec's `per_node` devices (0 .. per_node - 1): listed, healthy, idle."""
    if out.failure():
        return [error("npu", out.failure(), "check the driver: `npu-smi info` must answer")]
    chips = {c.device: c for c in parse_info(out.stdout)}
    if not chips:
        return [error("npu", "`npu-smi info` lists no NPU", "check the driver installation")]
    found: list[Check] = []
    listed = ", ".join(str(d) for d in sorted(chips))
    for device in range(per_node):
        chip = chips.get(device)
        if chip is None:
            found.append(
                error("npu", f"device {device} is not listed by npu-smi info (it lists {listed})",
                      f"the spec uses {per_node} devices per node: check the NPU's seating "
                      "and driver, or lower cluster.per_node", device)  # fmt: skip
            )
            continue
        health = chip.health.upper()
        if health == "WARNING":
            found.append(
                warning("npu", f"device {device} reports health Warning",
                        f"see `npu-smi info -t health -i {chip.npu}`", device)  # fmt: skip
            )
        elif health != "OK":
            found.append(
                error("npu", f"device {device} reports health {chip.health}",
                      f"see `npu-smi info -t health -i {chip.npu}`; the run would fail on it",
                      device)  # fmt: skip
            )
        for pid, name in chip.processes:
            found.append(
                error("npu", f"device {device} is in use by process {pid} ({name or 'unnamed'})",
                      f"wait for it to finish or stop it (kill {pid}) before the launch", device)  # fmt: skip
            )
    if not found:
        names = sorted({chips[d].name for d in range(per_node)})
        found.append(ok("npu", f"devices 0-{per_node - 1} ({', '.join(names)}) healthy and idle"))
    return found
