"""Topology: the mesh fills the cluster exactly, servers use 1, 2, 4 or 8 NPUs, a
tensor-parallel group stays inside a server, node and device addresses are valid,
distinct IPv4 addresses (one device IP per device), and the device is one msgen knows.

The rank table rules behind these are in shared/reference/ascend-launch.md.
"""

from __future__ import annotations

import ipaddress

from msgen.checks.facts import Facts
from msgen.diagnostics import Diagnostic, Span, did_you_mean, error
from msgen.ir.models import Spec

PER_NODE = (1, 2, 4, 8)
PORT_LIMIT = 65535

# The device catalogue's names. msgen/estimate/devices.py holds the catalogue
# itself (memory, FLOPs, links); this list must name the same entries.
DEVICE_NAMES = ("ascend910b", "ascend910b3", "ascend910b4", "ascend910a", "a100_80g", "h100_80g")


def device_names() -> tuple[str, ...]:
    """The catalogue's device names: the estimate's catalogue when it is there
    (`msgen.estimate.devices.DEVICES`, keyed by name), else DEVICE_NAMES."""
    try:
        from msgen.estimate.devices import DEVICES
    except ImportError:
        return DEVICE_NAMES
    names = tuple(DEVICES)
    return names if names and all(isinstance(n, str) for n in names) else DEVICE_NAMES


def or_list(items) -> str:
    items = [str(i) for i in items]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


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


def head_span(span: Span, word: str) -> Span:
    """The first `len(word)` columns of a span: a block's keyword, a call's name."""
    return span.model_copy(update={"end_line": span.line, "end_col": span.col + len(word)})


def factorizations(devices: int, spec: Spec, layers: int) -> list[tuple[int, int, int]]:
    """(dp, tp, pp) filling `devices`, with tp inside a server and dividing the heads,
    pp no more than the layers; those closest to the written mesh first."""
    mesh, cluster, dims = spec.mesh, spec.cluster, spec.model.dims
    per_node = cluster.per_node if cluster.per_node in PER_NODE else max(PER_NODE)
    heads = [dims[k] for k in ("heads", "kv_heads") if k in dims]
    out = []
    for tp in range(1, devices + 1):
        if devices % tp or per_node % tp or any(h % tp for h in heads):
            continue
        for pp in range(1, devices // tp + 1):
            if (devices // tp) % pp or (layers and pp > layers) or (not layers and pp > 1):
                continue
            out.append((devices // tp // pp, tp, pp))

    def distance(f):
        kept = sum(a == b for a, b in zip(f, (mesh.dp, mesh.tp, mesh.pp)))
        return (-kept, f[2] != mesh.pp, f[1] != mesh.tp, abs(f[1] - mesh.tp), f)

    return sorted(out, key=distance)


def total_layers(spec: Spec) -> int:
    return sum(op.args.get("count", 0) for op in spec.network.ops if op.kind == "repeat")


def check_mesh(spec: Spec) -> list[Diagnostic]:
    mesh, cluster = spec.mesh, spec.cluster
    diags: list[Diagnostic] = []
    nodes = len(cluster.nodes)
    devices = nodes * cluster.per_node
    if mesh.devices != devices:
        product = f"dp * tp * pp = {mesh.dp} * {mesh.tp} * {mesh.pp} = {mesh.devices}"
        node_word = "node" if nodes == 1 else "nodes"
        have = f"{nodes} {node_word} x {cluster.per_node} per node = {devices} devices"
        tries = factorizations(devices, spec, total_layers(spec))[:4]
        if devices == 0:
            hint = "list the nodes' addresses in `cluster.nodes`"
        elif tries:
            options = " or ".join(f"dp = {d}, tp = {t}, pp = {p}" for d, t, p in tries)
            hint = f"dp * tp * pp must equal the {devices} devices: try {options}"
        else:
            hint = f"dp * tp * pp must equal the {devices} devices"
        diags.append(
            error(
                "MSL301",
                f"the mesh does not fill the cluster: {product}, but it has {have}",
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
        key = str(ipaddress.IPv4Address(node))
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
            node_ips[str(ipaddress.IPv4Address(node))] = node
    seen: dict[str, tuple[int, int]] = {}
    for n, node_list in enumerate(ips):
        spans = cluster.device_ip_spans[n] if n < len(cluster.device_ip_spans) else ()
        file = cluster.device_ip_files[n] if n < len(cluster.device_ip_files) else None
        where_node = f"node {n}"
        if n < nodes:
            where_node += f" (`{cluster.nodes[n]}`)"
        if len(node_list) != cluster.per_node and cluster.per_node in PER_NODE:
            span = spans[0] if file is not None and spans else whole
            if file is None and n < len(cluster.device_ip_spans) and spans:
                span = spans[0].to(spans[-1])
            source = f"`{file}` lists" if file else "the list has"
            diags.append(
                error(
                    "MSL308",
                    f"{source} {len(node_list)} device IPs for {where_node}, but per_node = "
                    f"{cluster.per_node}",
                    span,
                    "give exactly one device IP per device used on the node, device 0 first",
                )
            )
        for d, ip in enumerate(node_list):
            span = spans[d] if d < len(spans) else whole
            what = f"`{file}` address_{d}" if file else "device IP"
            where = f"{where_node}, device {d}"
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
            key = str(ipaddress.IPv4Address(ip))
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
                first_node, first_dev = seen[key]
                diags.append(
                    error(
                        "MSL307",
                        f"{what} `{ip}` ({where}) is already used by node {first_node}, "
                        f"device {first_dev}",
                        span,
                        "every device IP in the cluster is distinct",
                    )
                )
            else:
                seen[key] = (n, d)
    return diags


def check_device(spec: Spec) -> list[Diagnostic]:
    cluster = spec.cluster
    names = device_names()
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
