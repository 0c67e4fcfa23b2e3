"""`msgen doctor SPEC [--set K=V] [--node N] [--peers] [--dryrun LOGDIR] [--json]`:
run the checks, print them, and give the exit status (0 no error, 1 an error)."""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from msgen import hostinfo
from msgen.base.status import UsageError
from msgen.compiler import estimable
from msgen.diagnostics import printable
from msgen.doctor import data, dryrun, hccn, network, npu, storage, versions
from msgen.doctor.compiled import compiled_plan, default_tree
from msgen.doctor.result import Check, Status, skipped
from msgen.doctor.tools import TIMEOUT_S, Tools
from msgen.ir.mesh import RankMesh
from msgen.syntax.overrides import flags


@dataclass(frozen=True)
class DoctorOptions:
    spec: Path
    node: int | None = None
    peers: bool = False
    dryrun: Path | None = None
    json: bool = False
    tree: Path | None = None  # the compiled tree (default generated/<model>/)
    run_from: Path | None = None  # where train.py runs: data paths resolve there (default: tree)
    output: Path | None = None  # train.py's --output (default: <tree>/output)
    compiled_from: str | None = None  # run only for the spec of this sha256 (the launch scripts)


@dataclass(frozen=True)
class Host:
    """What the checks read of the host, given so that a test can point it elsewhere."""

    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    machine: str = field(default_factory=platform.machine)
    driver_root: str = hostinfo.DEFAULT_DRIVER
    meminfo: Path = Path("/proc/meminfo")
    tool_timeout: float = TIMEOUT_S  # for npu-smi and hccn_tool queries


ASCEND_ONLY = ("cann", "driver", "paths", "npu", "hccn", "port")


def host_checks(
    plan, est, options: DoctorOptions, node: int, host: Host, compiled: dict | None = None
) -> list[Check]:
    """`compiled`: the plan.json of the tree compiled from this spec with these --set
    flags (its checkpoints are sized exactly), or None."""
    spec = plan.spec
    cluster, mesh = spec.cluster, RankMesh.of(spec)
    tools = Tools(host.environ, host.tool_timeout)
    found = [network.node_check(cluster.nodes, node, options.node is not None)]
    found += versions.interpreter_checks(tools)
    if tools.which("npu-smi") is None:
        found += [versions.no_npu(topic) for topic in ASCEND_ONLY]
        if options.peers:
            found.append(versions.no_npu("peers"))
    else:
        found += versions.stack_checks(host.environ, host.machine, host.driver_root)
        found += versions.path_checks(host.environ)
        found += npu.npu_checks(tools.run("npu-smi", "info"), cluster.per_node)
        ips = cluster.device_ips
        if tools.which("hccn_tool") is None:
            found.append(
                skipped("hccn", "hccn_tool not found (it ships with the driver, in driver/tools)")
            )
        else:
            found += hccn.hccn_checks(
                tools, cluster.per_node, ips[node] if ips else None, cluster.device
            )
            if options.peers and ips and len(ips) > 1:
                found += hccn.peer_checks(tools, node, ips)
            elif options.peers:
                found.append(
                    skipped("peers", "one node, or no device_ips in the spec: no peers to reach")
                )
        found += network.hccl_port_checks(host.environ)
    found += network.master_checks(host.environ, cluster.nodes, cluster.master_port, node)
    exact = storage.stage_checkpoint_bytes(compiled, spec.semi_auto) if compiled else None
    per_stage = exact or [s.weights_bytes + s.optimizer_bytes for s in est.stages]
    one = storage.checkpoint_bytes(per_stage, mesh.server_ranks(node), mesh)
    keep = spec.train.checkpoint.keep if spec.train.checkpoint else 1
    tree = options.tree or default_tree(spec)
    found += storage.output_checks(options.output or tree / "output", one, keep, bool(exact))
    files = [
        (role, p) for role, p in (("train", spec.train.data), ("valid", spec.train.valid)) if p
    ]
    vocab = spec.model.dims["vocab"]
    found += data.data_checks(tools, files, options.run_from or tree, vocab, spec.model.dims["seq"])
    meminfo = host.meminfo.read_text() if host.meminfo.is_file() else None
    found += storage.memory_checks(meminfo, one, bool(exact))
    return found


def counts(checks: list[Check]) -> dict[str, int]:
    return {s.value: sum(c.status == s for c in checks) for s in Status}


def summary(checks: list[Check]) -> str:
    n = counts(checks)

    def word(k: int, w: str) -> str:
        return f"{k} {w}{'' if k == 1 else 's'}"

    return ", ".join(
        [
            word(n["error"], "error"),
            word(n["warning"], "warning"),
            f"{n['skipped']} skipped",
            f"{n['ok']} ok",
        ]
    )


def render_text(title: str, checks: list[Check]) -> str:
    """The checks for a terminal: what they quote of the host (paths, tools' words,
    variables) printably, whatever a check forgot."""
    width = max((len(c.topic) for c in checks), default=0)
    lines = [printable(title)]
    for c in checks:
        lines.append(f"  {c.status.value:<8} {c.topic:<{width}}  {printable(c.message)}")
        if c.fix and c.status in (Status.ERROR, Status.WARNING):
            lines.append(f"  {'':<8} {'':<{width}}  fix: {printable(c.fix)}")
    lines.append(summary(checks))
    return "\n".join(lines) + "\n"


def doctor_command(result, options: DoctorOptions, host: Host | None = None) -> int:
    """0 when no check is an error, 1 when one is or the spec has errors (already
    printed); with `compiled_from`, 0 at once for a spec the tree was not compiled from
    (compile refuses a spec with errors, so that is one too)."""
    from msgen.analysis.plan import Plan
    from msgen.estimate.memory import estimate

    host = host or Host()
    spec = result.spec
    if options.compiled_from is not None and (
        not result.ok or spec.sha256 != options.compiled_from
    ):
        sys.stderr.write(
            f"msgen doctor: skipped: {options.spec} is not the spec this tree was compiled from "
            "(its sha256 differs)\n"
        )
        return 0
    if not estimable(result):
        return 1
    nodes = spec.cluster.nodes
    if options.node is not None and not 0 <= options.node < len(nodes):
        raise UsageError(f"--node {options.node}: the spec has nodes 0 to {len(nodes) - 1}")
    plan = Plan(spec, result.facts)
    est = estimate(plan)
    rows: list[dryrun.StageRow] = []
    if options.dryrun is not None:
        logs = dryrun.read_logs(options.dryrun)
        mesh = RankMesh.of(spec)
        rows = dryrun.stage_rows(logs, [s.total_bytes for s in est.stages], est.budget_bytes, mesh)
        checks = dryrun.dryrun_checks(options.dryrun, logs, rows, mesh)
        title = f"msgen doctor: {options.spec}, dry run in {options.dryrun}"
        node = None
    else:
        node = options.node if options.node is not None else network.find_node(nodes) or 0
        compiled = compiled_plan(spec, result.sets, options.tree or default_tree(spec))
        checks = host_checks(plan, est, options, node, host, compiled)
        title = (f"msgen doctor: {options.spec}{f' with {flags(result.sets)}' if result.sets else ''}, node {node} ({nodes[node]}), "
                 f"{spec.cluster.per_node} devices")  # fmt: skip
    if options.json:
        doc = {
            "spec": str(options.spec),
            "set": list(result.sets),
            "node": node,
            "devices": spec.cluster.per_node,
            "checks": [c.as_json() for c in checks],
            **counts(checks),
        }
        if options.dryrun is not None:
            doc["dryrun"] = [r.as_json() for r in rows]
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write((dryrun.render_rows(rows) if rows else "") + render_text(title, checks))
    return 1 if any(c.status == Status.ERROR for c in checks) else 0
