"""The parameter network as `hccn_tool` shows it: each device's RoCE address, link and
TLS switch, the subnet rules of the device type, and (`--peers`) reachability.

Output formats, from Huawei's HCCN Tool Interface Reference (Ascend HDK):
`-ip -g` prints `ipaddr:A` and `netmask:M`; `-link -g` prints `link status: UP` (or
DOWN); `-tls -g` prints `dev_id:N, tls switch[0](0:disable, 1:enable), ...`; `-ping -g
address A` ends with `3 packets transmitted, 3 received, 0.00% packet loss`.
HCCL refuses to build a communicator whose ranks disagree on TLS.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence

from msgen.doctor.result import Check, error, ok, warning
from msgen.doctor.tools import Tools

PING_TIMEOUT_S = 15.0  # three probes a second apart, and the tool's own start


def _field(text: str, key: str) -> str | None:
    m = re.search(rf"^\s*{key}\s*:\s*(\S+)", text, re.MULTILINE)
    return m.group(1) if m else None


def parse_ip(text: str) -> tuple[str | None, str | None]:
    """(address, netmask) of `hccn_tool -i N -ip -g`."""
    return _field(text, "ipaddr"), _field(text, "netmask")


def parse_link(text: str) -> str | None:
    """UP or DOWN, from `hccn_tool -i N -link -g`."""
    value = _field(text, "link status")
    return value.upper() if value else None


def parse_tls(text: str) -> int | None:
    """The TLS switch (0 off, 1 on) of `hccn_tool -i N -tls -g`."""
    m = re.search(r"tls switch\[(\d)\]", text)
    return int(m.group(1)) if m else None


def parse_ping(text: str) -> tuple[int, int] | None:
    """(sent, received) of `hccn_tool -i N -ping -g address A`."""
    m = re.search(r"(\d+) packets transmitted, (\d+) received", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def subnet_checks(device_type: str, nets: dict[int, ipaddress.IPv4Network]) -> list[Check]:
    """Where the node's device subnets break the rule of its server type (Huawei's
    MindCluster Ascend Deployer guide, "Configuring the parameter plane network").
    Atlas 800 (910A): NPU i and i + 4 in one subnet and NPUs 0-3 each in a different
    one (so 4-7), which HCCL's two rings need: an error. Atlas 800T A2 (910B): the
    node's NPU ports in one subnet, the guide's policy; HCCL needs only routes between
    them (`--peers` checks those): a warning."""
    fix = "re-address the devices as the server's networking guide asks (docs/doctor.md)"
    found = []
    if device_type.startswith("ascend910b"):
        groups: dict[ipaddress.IPv4Network, list[int]] = {}
        for device, net in sorted(nets.items()):
            groups.setdefault(net, []).append(device)
        if len(groups) > 1:
            where = "; ".join(f"{net}: {', '.join(map(str, ds))}" for net, ds in groups.items())
            found.append(warning("hccn", f"the devices are not in one subnet ({where})", fix))
    elif device_type == "ascend910a":
        for i in range(4):
            if i in nets and i + 4 in nets and nets[i] != nets[i + 4]:
                found.append(error("hccn", f"devices {i} and {i + 4} are in different subnets "
                                   f"({nets[i]}, {nets[i + 4]})", fix, i + 4))  # fmt: skip
        for half in (range(4), range(4, 8)):
            seen: dict[ipaddress.IPv4Network, int] = {}
            for i in half:
                if i in nets and nets[i] in seen:
                    found.append(error("hccn", f"devices {seen[nets[i]]} and {i} share subnet {nets[i]}",
                                       fix, i))  # fmt: skip
                elif i in nets:
                    seen[nets[i]] = i
    return found


def hccn_checks(
    tools: Tools, per_node: int, expected: Sequence[str] | None, device_type: str
) -> list[Check]:
    """Each local device's address against the spec's `device_ips` for this node, its
    link, and TLS agreement and the subnet rule across the node's devices."""
    found: list[Check] = []
    nets: dict[int, ipaddress.IPv4Network] = {}
    tls: dict[int, int] = {}
    for device in range(per_node):
        ip_out = tools.run("hccn_tool", "-i", str(device), "-ip", "-g")
        if ip_out.failure():
            found.append(error("hccn", ip_out.failure(), "check the device's network port", device))
            continue
        address, netmask = parse_ip(ip_out.stdout)
        if address is None:
            found.append(error("hccn", f"device {device} has no RoCE address",
                               f"set it: hccn_tool -i {device} -ip -s address A netmask M", device))  # fmt: skip
        elif expected is not None and address != expected[device]:
            found.append(error("hccn", f"device {device} has address {address}; the spec's device_ips give {expected[device]}",
                               "correct the spec's device_ips (or /etc/hccn.conf it reads), or the "
                               f"device: hccn_tool -i {device} -ip -s address {expected[device]} ...",
                               device))  # fmt: skip
        if address and netmask:
            try:
                nets[device] = ipaddress.IPv4Interface(f"{address}/{netmask}").network
            except ValueError:
                found.append(error("hccn", f"device {device}: {address}/{netmask} is not an IPv4 address and netmask",
                                   "set a valid address and netmask with hccn_tool", device))  # fmt: skip
        link_out = tools.run("hccn_tool", "-i", str(device), "-link", "-g")
        link = None if link_out.failure() else parse_link(link_out.stdout)
        if link != "UP":
            found.append(error("hccn", f"device {device}: link is {link or 'unknown'}",
                               f"check the cable and switch port of device {device} "
                               f"(hccn_tool -i {device} -link -g must say UP)", device))  # fmt: skip
        tls_out = tools.run("hccn_tool", "-i", str(device), "-tls", "-g")
        switch = None if tls_out.failure() else parse_tls(tls_out.stdout)
        if switch is not None:
            tls[device] = switch
    if len(set(tls.values())) > 1:
        on = [d for d, s in sorted(tls.items()) if s]
        off = [d for d, s in sorted(tls.items()) if not s]
        found.append(error("hccn", f"TLS is on for devices {', '.join(map(str, on))} and off for "
                           f"{', '.join(map(str, off))}",
                           "set one switch on every device of every node, e.g. "
                           "`hccn_tool -i N -tls -s enable 0` for each N"))  # fmt: skip
    found += subnet_checks(device_type, nets)
    if not found:
        switch = "on" if any(tls.values()) else "off"
        addresses = (
            "addresses as the spec says" if expected else "addresses set (the spec lists none)"
        )
        found.append(
            ok("hccn", f"devices 0-{per_node - 1}: {addresses}, links up, TLS {switch} on all")
        )
    return found


def peer_checks(tools: Tools, node: int, device_ips: Sequence[Sequence[str]]) -> list[Check]:
    """`--peers`: each local device pings the device of the same index on every other
    node (the pairs HCCL's inter-node rings use)."""
    found: list[Check] = []
    for other, ips in enumerate(device_ips):
        if other == node:
            continue
        for device, address in enumerate(ips):
            out = tools.run("hccn_tool", "-i", str(device), "-ping", "-g", "address", address,
                            timeout=PING_TIMEOUT_S)  # fmt: skip
            counts = None if out.timed_out else parse_ping(out.stdout)
            if counts is None or counts[1] == 0:
                found.append(error("peers", f"device {device} cannot reach node {other}'s device {device} ({address})",
                                   "check routes, netmask, VLAN and switch between the nodes' device ports",
                                   device))  # fmt: skip
            elif counts[1] < counts[0]:
                found.append(warning("peers", f"device {device} lost {counts[0] - counts[1]} of {counts[0]} "
                                     f"pings to node {other} ({address})", "check the link for errors", device))  # fmt: skip
    if not found:
        found.append(
            ok("peers", f"every device reaches its peers on the {len(device_ips) - 1} other nodes")
        )
    return found
