"""Topology: the mesh fills the cluster exactly, servers use 1, 2, 4 or 8 NPUs, a
tensor-parallel group stays inside a server, node and device addresses are valid,
distinct IPv4 addresses (one device IP per device), and the device is one msgen knows.

The rank table rules behind these are in shared/reference/ascend-launch.md.
"""

from __future__ import annotations

import ipaddress
from functools import cache

from msgen.analysis.facts import Facts
from msgen.diagnostics import Diagnostic, Span, did_you_mean, error
from msgen.ir.devices import DEVICES
from msgen.ir.models import Spec

PER_NODE = (1, 2, 4, 8)
PORT_LIMIT = 65535
MAX_STAGES = 1024  # pipeline depths a suggestion may propose


def or_list(items) -> str:
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


@cache  # a cluster's addresses are checked again for every layout `msgen plan` tries
def ipv4_problem(text: str) -> str | None:
    """Why `text` is not a usable IPv4 address, or None when it is one."""
    try:
        addr = ipaddress.IPv4Address(text)
    except ValueError:
        if any(c.isalpha() for c in text) and "." not in text.strip("."):
            return "a host name, not an IPv4 address"
        return "not an IPv4 address"
    if addr.is_unspecified:
        return "the unspecified address"
    if addr.is_multicast:
        return "a multicast address"
    if addr.is_reserved or text == "255.255.255.255":
        return "a reserved address"
    return None


@cache
def canonical_ipv4(text: str) -> str:
    """One spelling per address (of a usable one), to find the same address twice."""
    return str(ipaddress.IPv4Address(text))


def head_span(span: Span, word: str) -> Span:
    """The first `len(word)` columns of a span: a block's keyword, a call's name."""
    return span.first(len(word))


def factorizations(devices: int, spec: Spec, layers: int) -> list[tuple[int, int, int]]:
    """(dp, tp, pp) filling `devices`, with tp inside a server and dividing the heads,
    pp no more than the layers; those closest to the written mesh first."""
    mesh, cluster, dims = spec.mesh, spec.cluster, spec.model.dims
    per_node = cluster.per_node if cluster.per_node in PER_NODE else max(PER_NODE)
    heads = [dims[k] for k in ("heads", "kv_heads") if k in dims]
    out = []
    for tp in PER_NODE:  # tp divides per_node, one of these
        if devices % tp or per_node % tp or any(h % tp for h in heads):
            continue
        # pp divides the rest and is at most the layers (and a sane stage count)
        for pp in range(1, min(devices // tp, max(1, layers), MAX_STAGES) + 1):
            if (devices // tp) % pp == 0:
                out.append((devices // tp // pp, tp, pp))

    def distance(f):
        kept = sum(a == b for a, b in zip(f, (mesh.dp, mesh.tp, mesh.pp)))
        return (-kept, f[2] != mesh.pp, f[1] != mesh.tp, abs(f[1] - mesh.tp), f)

    return sorted(out, key=distance)


def check_mesh(spec: Spec) -> list[Diagnostic]:
    mesh, cluster = spec.mesh, spec.cluster
    diags: list[Diagnostic] = []
    nodes = len(cluster.nodes)
    devices = nodes * cluster.per_node
    if mesh.devices != devices:
        node_word = "node" if nodes == 1 else "nodes"
        tries = factorizations(devices, spec, spec.network.total_layers)[:3]
        if devices == 0:
            hint = "list the nodes' addresses in `cluster.nodes`"
        elif tries:
            options = "; or ".join(f"dp = {d}, tp = {t}, pp = {p}" for d, t, p in tries)
            hint = f"dp * tp * pp must equal the {devices} devices: try {options}"
        else:
            hint = f"dp * tp * pp must equal the {devices} devices"
        diags.append(
            error(
                "MSL301",
                f"the mesh needs dp * tp * pp = {mesh.dp} * {mesh.tp} * {mesh.pp} = "
                f"{mesh.devices} devices, but the cluster has {nodes} {node_word} x "
                f"{cluster.per_node} = {devices}",
                head_span(spec.block_spans.get("mesh", mesh.span), "mesh"),
                hint,
            )
        )
    per_node_span = cluster.spans.get("per_node", cluster.span)
    if cluster.per_node not in PER_NODE:
        below = max((n for n in PER_NODE if n < cluster.per_node), default=1)
        diags.append(
            error(
                "MSL302",
                f"per_node = {cluster.per_node}: a server uses 1, 2, 4 or 8 NPUs",
                per_node_span,
                f"use per_node = {below} (or another of 1, 2, 4, 8) on every node",
            )
        )
    elif mesh.tp > cluster.per_node or cluster.per_node % mesh.tp:
        fits = [t for t in PER_NODE if cluster.per_node % t == 0]
        diags.append(
            error(
                "MSL303",
                f"tp = {mesh.tp} does not fit in a server of per_node = {cluster.per_node}: "
                "a tensor-parallel group would span nodes",
                mesh.spans.get("tp", mesh.span),
                "tp ranks are consecutive, so a tp group stays on one server only when tp "
                f"divides per_node: try tp = {or_list(fits)}, "
                "and move the rest to dp or pp",
            )
        )
    return diags


def check_nodes(spec: Spec) -> list[Diagnostic]:
    cluster = spec.cluster
    diags: list[Diagnostic] = []
    fallback = cluster.spans.get("nodes", cluster.span)
    seen: dict[str, int] = {}
    for i, node in enumerate(cluster.nodes):
        span = cluster.node_spans[i] if i < len(cluster.node_spans) else fallback
        problem = ipv4_problem(node)
        if problem is not None:
            diags.append(
                error(
                    "MSL304",
                    f"node `{node}` is {problem}",
                    span,
                    "the rank table's server_id is the node's IPv4 address (`ip -4 addr` on "
                    "the server), not its host name",
                )
            )
            continue
        key = canonical_ipv4(node)
        if key in seen:
            diags.append(
                error(
                    "MSL305",
                    f"node `{node}` is listed twice (entries {seen[key]} and {i})",
                    span,
                    "list each server once, in rank order",
                )
            )
            continue
        seen[key] = i
    return diags


def check_device_ips(spec: Spec) -> list[Diagnostic]:
    cluster = spec.cluster
    ips = cluster.device_ips
    if ips is None:
        return []
    diags: list[Diagnostic] = []
    whole = cluster.spans.get("device_ips", cluster.span)
    nodes = len(cluster.nodes)
    if len(ips) != nodes:
        entries = f"{len(ips)} {'entry' if len(ips) == 1 else 'entries'}"
        diags.append(
            error(
                "MSL308",
                f"device_ips has {entries}, but the cluster has {nodes} "
                f"{'node' if nodes == 1 else 'nodes'}",
                whole,
                'give one entry per node, in the order of `nodes`: `[hccn("node0.conf"), '
                'hccn("node1.conf")]` or lists of IPs',
            )
        )
    node_ips = {}
    for node in cluster.nodes:
        if ipv4_problem(node) is None:
            node_ips[canonical_ipv4(node)] = node
    seen: dict[str, tuple[int, int]] = {}
    for n, node_list in enumerate(ips):
        spans = cluster.device_ip_spans[n] if n < len(cluster.device_ip_spans) else ()
        file = cluster.device_ip_files[n] if n < len(cluster.device_ip_files) else None
        server = f" `{cluster.nodes[n]}`" if n < nodes else ""
        if len(node_list) != cluster.per_node and cluster.per_node in PER_NODE:
            if file is not None and spans:
                span, source = spans[0], f"`{file}` lists"
            elif spans:
                span, source = spans[0].to(spans[-1]), "the list has"
            else:
                span, source = whole, "the list has"
            hint = "give exactly one device IP per device used on the node, device 0 first"
            if file is not None and len(node_list) > cluster.per_node:
                hint = (
                    f"an hccn.conf lists every NPU of the server; with per_node = "
                    f"{cluster.per_node}, write the used devices' IPs as a list, device 0 first"
                )
            diags.append(
                error(
                    "MSL308",
                    f"{source} {len(node_list)} device IPs for node {n}{server}, but per_node = "
                    f"{cluster.per_node}",
                    span,
                    hint,
                )
            )
        repeated: list[tuple[int, str, tuple[int, int]]] = []
        for d, ip in enumerate(node_list):
            span = spans[d] if d < len(spans) else whole
            what = f"`{file}` address_{d}" if file else "device IP"
            where = f"node {n}{server}, device {d}"
            problem = ipv4_problem(ip)
            if problem is not None:
                diags.append(
                    error(
                        "MSL306",
                        f"{what} `{ip}` ({where}) is {problem}",
                        span,
                        "a device IP is the NPU's own RoCE address: `hccn_tool -i "
                        f"{d} -ip -g` on the server, or `address_{d}=` in /etc/hccn.conf",
                    )
                )
                continue
            key = canonical_ipv4(ip)
            if key in node_ips:
                diags.append(
                    error(
                        "MSL307",
                        f"{what} `{ip}` ({where}) is also a node address",
                        span,
                        "device IPs are the NPUs' RoCE addresses, not the servers' own",
                    )
                )
            elif key in seen:
                repeated.append((d, ip, seen[key]))
            else:
                seen[key] = (n, d)
        if repeated:
            d, ip, (first_node, first_dev) = repeated[0]
            what = f"`{file}` address_{d}" if file else "device IP"
            more = len(repeated) - 1
            also = f"; {more} more of this node's device IPs repeat earlier ones" if more else ""
            diags.append(
                error(
                    "MSL307",
                    f"{what} `{ip}` (node {n}{server}, device {d}) is already used by node "
                    f"{first_node}, device {first_dev}{also}",
                    spans[d] if d < len(spans) else whole,
                    "every device IP in the cluster is distinct: each node has its own "
                    "hccn.conf",
                )
            )
    return diags


def check_device(spec: Spec) -> list[Diagnostic]:
    cluster = spec.cluster
    names = tuple(DEVICES)
    if cluster.device in names:
        return []
    span = cluster.spans.get("device", cluster.span)
    return [
        error(
            "MSL310",
            f"unknown device `{cluster.device}`",
            span,
            did_you_mean(cluster.device, names) or f"devices: {', '.join(names)}",
        )
    ]


def check_port(spec: Spec) -> list[Diagnostic]:
    cluster = spec.cluster
    if cluster.master_port <= PORT_LIMIT:
        return []
    return [
        error(
            "MSL316",
            f"master_port = {cluster.master_port} is not a TCP port",
            cluster.spans.get("master_port", cluster.span),
            f"ports run 1..{PORT_LIMIT}; the default is 8118",
        )
    ]


def run(spec: Spec, facts: Facts) -> list[Diagnostic]:
    return (
        check_device(spec)
        + check_mesh(spec)
        + check_nodes(spec)
        + check_device_ips(spec)
        + check_port(spec)
    )
