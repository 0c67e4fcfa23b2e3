"""This host in the cluster: which node it is, the master's address and port, and the
host ports HCCL takes.

msrun starts its scheduler on the host that owns the master address (MindSpore 2.10,
parallel/cluster/process_entity/_api.py: `is_master = _is_local_ip(master_addr)`), so
node 0 must own it, or every node waits out the cluster timeout. HCCL takes
HCCL_IF_BASE_PORT (default 60000) and the 31 ports after it on each host (CANN 8.2+
environment variable reference, HCCL_IF_BASE_PORT).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Mapping, Sequence

from msgen.doctor.result import Check, error, ok, warning

HCCL_BASE_PORT = 60000
HCCL_PORTS = 32


def _family(address: str) -> socket.AddressFamily:
    try:
        return socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET
    except ValueError:
        return socket.AF_INET


def is_local(address: str) -> bool:
    """Whether this host owns `address` (binding to it succeeds)."""
    try:
        with socket.socket(_family(address), socket.SOCK_STREAM) as s:
            s.bind((address, 0))
        return True
    except (OSError, OverflowError):
        return False


def port_free(port: int, address: str = "") -> bool:
    """Whether a server could listen on `port` here (as msrun's scheduler does)."""
    try:
        with socket.socket(_family(address or "0.0.0.0"), socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((address, port))
        return True
    except (OSError, OverflowError):
        return False


def find_node(nodes: Sequence[str]) -> int | None:
    """The index of the first node address this host owns, or None."""
    return next((i for i, address in enumerate(nodes) if is_local(address)), None)


def node_check(nodes: Sequence[str], node: int, chosen: bool) -> Check:
    if chosen:
        return ok("node", f"checking node {node} ({nodes[node]}), as asked")
    if is_local(nodes[node]):
        return ok("node", f"this host is node {node} ({nodes[node]})")
    return warning("node", f"none of the spec's node addresses ({', '.join(nodes)}) is this host's: "
                   "checked as node 0", "run doctor on a node of the cluster, or name one with --node N")  # fmt: skip


def master(environ: Mapping[str, str], nodes: Sequence[str], port: int) -> tuple[str, int]:
    """The master address and port as the launch scripts take them: MASTER_ADDR and
    MASTER_PORT when set and not empty, else the spec's."""
    address = environ.get("MASTER_ADDR") or nodes[0]
    raw = environ.get("MASTER_PORT") or ""
    return address, int(raw) if raw.isdigit() else port


def master_checks(
    environ: Mapping[str, str], nodes: Sequence[str], port: int, node: int
) -> list[Check]:
    """On node 0: it owns the master address, and the master port is free."""
    address, port = master(environ, nodes, port)
    if node != 0:
        return [ok("master", f"the master is {address}:{port} (node 0 starts msrun's scheduler)")]
    found = []
    if not is_local(address):
        found.append(error("master", f"node 0 must own the master address {address}, which is not one of "
                           "this host's", "run node 0 on that host, or set MASTER_ADDR to one of this "
                           "host's addresses on every node"))  # fmt: skip
    if not (0 < port < 65536) or not port_free(port):
        found.append(error("port", f"master port {port} is in use on this host",
                           "stop what holds it (ss -ltnp | grep :PORT shows it) or set MASTER_PORT to a "
                           "free port on every node"))  # fmt: skip
    return found or [ok("master", f"master {address}:{port}: this host's, port free")]


def hccl_port_checks(environ: Mapping[str, str]) -> list[Check]:
    raw = environ.get("HCCL_IF_BASE_PORT") or ""
    base = int(raw) if raw.isdigit() else HCCL_BASE_PORT
    busy = [p for p in range(base, base + HCCL_PORTS) if not port_free(p)]
    if busy:
        return [error("port", f"HCCL's host ports {base}-{base + HCCL_PORTS - 1}: {', '.join(map(str, busy))} in use",
                      "free them, or set HCCL_IF_BASE_PORT to the start of 32 free ports (and reserve "
                      "them: sysctl -w net.ipv4.ip_local_reserved_ports=...)")]  # fmt: skip
    return [ok("port", f"HCCL's host ports {base}-{base + HCCL_PORTS - 1} free")]
