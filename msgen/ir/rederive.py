"""What a `--set` leaves to follow from the rest: by default a what-if keeps the
cluster's devices and the global batch, so `dp` and a written `micro_batches`
are worked out again from the values given, the way a person would redo the
arithmetic by hand. A value given with `--set` is never re-derived, so a list
of flags means the same in any order.

`cluster.devices = N` is a what-if key, not a spec key: it answers "what about
N cards?" for `estimate` and `plan` by keeping the written nodes (the first
N / per_node of them) and making up the addresses of the rest, so it cannot be
compiled (a rank table needs every server's real address).
"""

from __future__ import annotations

import ipaddress

from msgen.ir.models import Spec

DEVICES_KEY = "cluster.devices"
# What each re-derived key follows from; a --set of none of these leaves it alone.
DP_INPUTS = {"mesh.tp", "mesh.pp", "cluster.per_node", "cluster.nodes", DEVICES_KEY}
MICRO_BATCHES_INPUTS = {"mesh.dp", "train.micro_batch", "train.global_batch"} | DP_INPUTS
# Made-up servers take addresses of 198.18.0.0/15, the range RFC 2544 sets aside
# for benchmarks: never a real server's, and usable as a rank table's server_id.
SYNTHETIC = ipaddress.IPv4Network("198.18.0.0/15")
MAX_NODES = 16384


def devices_problem(text: str, per_node: int) -> str | None:
    """Why `--set cluster.devices=TEXT` names no cluster of per_node-device servers."""
    value = text.strip().replace("_", "")
    if not value.isascii() or not value.isdigit() or len(value) > 12:
        return f"cluster.devices is a whole number of devices, not {text.strip()[:40]!r}"
    devices = int(value)
    if per_node < 1:
        return None  # the cluster's own error says so
    if devices < 1 or devices % per_node:
        below = max(per_node, devices // per_node * per_node)
        near = sorted({below, max(per_node, -(-devices // per_node) * per_node)})
        return (
            f"cluster.devices = {devices} is not a whole number of servers of per_node = "
            f"{per_node}: try {' or '.join(map(str, near))}"
        )
    if devices // per_node > MAX_NODES:
        return f"cluster.devices = {devices} is more than {MAX_NODES:,} servers"
    return None


def with_devices(spec: Spec, devices: int) -> Spec:
    """The spec on `devices` devices: its written nodes, the first devices / per_node of
    them, then made-up ones. Device IPs are per server, so a changed count drops them
    (estimate and plan never read them)."""
    count = devices // spec.cluster.per_node
    nodes = list(spec.cluster.nodes[:count])
    taken = set(nodes)
    for address in SYNTHETIC.hosts():
        if len(nodes) >= count:
            break
        if str(address) not in taken:
            nodes.append(str(address))
    if len(nodes) == len(spec.cluster.nodes):
        return spec
    cluster = spec.cluster.model_copy(
        update={
            "nodes": tuple(nodes),
            "node_spans": spec.cluster.node_spans[:count],
            "device_ips": None,
            "device_ip_spans": (),
            "device_ip_files": (),
        }
    )
    return spec.model_copy(update={"cluster": cluster})


def followers(spec: Spec, given: set[str]) -> dict[str, int]:
    """The values that follow from the `given` keys, by `BLOCK.KEY`, where they change:
    `mesh.dp` from the devices, a written `pipeline.micro_batches` from the global batch.
    `spec` holds the given values. The one rule of "the spec with these settings",
    for `--set` (msgen.compiler) and for the what-ifs and the planner, which build
    their variants on the IR (msgen.estimate.whatif)."""
    out: dict[str, int] = {}
    dp = spec.mesh.dp
    devices = spec.cluster.per_node * len(spec.cluster.nodes)
    per_replica = spec.mesh.tp * spec.mesh.pp
    if (
        "mesh.dp" not in given
        and given & DP_INPUTS
        and per_replica
        and devices % per_replica == 0
        and devices // per_replica != dp
    ):
        dp = out["mesh.dp"] = devices // per_replica
    written = spec.pipeline.micro_batches
    per_step = spec.train.micro_batch * dp
    if (
        written is not None
        and "pipeline.micro_batches" not in given
        and (given & MICRO_BATCHES_INPUTS or out)
        and per_step
        and spec.train.global_batch % per_step == 0
        and spec.train.global_batch // per_step != written
    ):
        out["pipeline.micro_batches"] = spec.train.global_batch // per_step
    return out


def rederived(spec: Spec, given: set[str]) -> tuple[list[str], list[str]]:
    """`--set` arguments for the keys that follow from the given ones, and how each
    changes (`dp 4 → 2`). `spec` is lowered with the given values in place."""
    follow = followers(spec, given)
    old = {"mesh.dp": spec.mesh.dp, "pipeline.micro_batches": spec.pipeline.micro_batches}
    sets = [f"{key}={value}" for key, value in follow.items()]
    changes = [f"{key.partition('.')[2]} {old[key]} → {value}" for key, value in follow.items()]
    return sets, changes
