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

from msgen.diagnostics import printable
from msgen.doctor.result import Check, error, ok, warning

HCCL_BASE_PORT = 60000
HCCL_PORTS = 32
LAST_PORT = 65535
SHOWN = 20  # characters of a variable's value a message quotes


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


def env_port(environ: Mapping[str, str], name: str) -> int | str | None:
    """The port the variable `name` sets: None when it is unset or empty (the default
    applies, as in the launch scripts), else a port of 1 to 65535, or why its value is
    not one, naming it (a string, never an int of thousands of digits)."""
    raw = environ.get(name) or ""
    if not raw:
        return None
    if raw.isascii() and raw.isdigit() and len(raw) <= 12:
        port = int(raw)
        if 0 < port <= LAST_PORT:
            return port
        if port > LAST_PORT:
            return f"{name}={raw} is above {LAST_PORT}, the last port"
    more = f"... ({len(raw)} characters)" if len(raw) > SHOWN else ""
    return f"{name}={printable(raw[:SHOWN])}{more} is not a port number (1 to {LAST_PORT})"


def master(environ: Mapping[str, str], nodes: Sequence[str], port: int) -> tuple[str, int | str]:
    """The master address and port as the launch scripts take them: MASTER_ADDR and
    MASTER_PORT when set and not empty, else the spec's; the port is why MASTER_PORT
    is none when it is not one."""
    address = environ.get("MASTER_ADDR") or nodes[0]
    given = env_port(environ, "MASTER_PORT")
    return address, port if given is None else given


def master_checks(
    environ: Mapping[str, str], nodes: Sequence[str], port: int, node: int
) -> list[Check]:
    """On node 0: it owns the master address, and the master port is free."""
    address, port = master(environ, nodes, port)
    address = printable(address)
    if isinstance(port, str):
        return [error("port", port, "set MASTER_PORT to a free port on every node, or unset "
                      "it for the spec's cluster.master_port")]  # fmt: skip
    if node != 0:
        return [ok("master", f"the master is {address}:{port} (node 0 starts msrun's scheduler)")]
    found = []
    if not is_local(address):
        found.append(error("master", f"node 0 must own the master address {address}, which is not one of "
                           "this host's", "run node 0 on that host, or set MASTER_ADDR to one of this "
                           "host's addresses on every node"))  # fmt: skip
    if not port_free(port):
        found.append(error("port", f"master port {port} is in use on this host",
                           "stop what holds it (ss -ltnp | grep :PORT shows it) or set MASTER_PORT to a "
                           "free port on every node"))  # fmt: skip
    return found or [ok("master", f"master {address}:{port}: this host's, port free")]


def hccl_port_checks(environ: Mapping[str, str]) -> list[Check]:
    """HCCL_IF_BASE_PORT names the first of HCCL's 32 ports: each must be a port and
    free; none above 65535 is ever probed."""
    top = LAST_PORT - HCCL_PORTS + 1
    fix = (f"set HCCL_IF_BASE_PORT to the first of {HCCL_PORTS} free ports (1 to {top}), "
           f"or unset it for HCCL's default {HCCL_BASE_PORT}")  # fmt: skip
    given = env_port(environ, "HCCL_IF_BASE_PORT")
    if isinstance(given, str):
        return [error("port", given, fix)]
    base = HCCL_BASE_PORT if given is None else given
    last = base + HCCL_PORTS - 1
    if last > LAST_PORT:
        return [error("port", f"HCCL_IF_BASE_PORT={base}: HCCL takes ports {base}-{last}, past "
                      f"{LAST_PORT}", fix)]  # fmt: skip
    busy = [p for p in range(base, last + 1) if not port_free(p)]
    if busy:
        return [error("port", f"HCCL's host ports {base}-{last}: {', '.join(map(str, busy))} in use",
                      "free them, or set HCCL_IF_BASE_PORT to the start of 32 free ports (and reserve "
                      "them: sysctl -w net.ipv4.ip_local_reserved_ports=...)")]  # fmt: skip
    return [ok("port", f"HCCL's host ports {base}-{last} free")]
