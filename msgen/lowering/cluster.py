"""Lowering of the cluster block, and the one place that reads files a spec
names (hccn.conf), each kept for the spec's hash."""

from __future__ import annotations

import re

from msgen.base.files import read_regular
from msgen.diagnostics import Span, format_bytes
from msgen.ir import models as ir
from msgen.lowering.evaluate import Evaluator
from msgen.lowering.reader import Reader
from msgen.syntax import ast

HCCN_LIMIT = 2**20  # an hccn.conf for 16 NPUs is under 2 KiB


class ClusterLowering(Reader):
    """The cluster block: nodes, devices and their addresses."""

    def lower_cluster(self, block: ast.Block, ev: Evaluator) -> ir.Cluster:
        stmts = self.keyed(block, "cluster")
        values: dict = {}
        for key, stmt in stmts.items():
            v = stmt.value
            if key == "device":
                values[key] = self.name_value(stmt)
            elif key in ("per_node", "master_port"):
                values[key] = ev.dim(v, key)
            elif key == "nodes":
                if isinstance(v, ast.List):
                    items = [self.string_value(i, "a node address") for i in v.items]
                    values[key] = tuple(i for i in items if i is not None)
                    values["node_spans"] = tuple(i.span for i in v.items)
                else:
                    self.err("MSL108", 'nodes is a list of addresses: `["10.0.0.1", ...]`', v.span)
            elif key == "device_ips":
                ips, sources, spans, files = self.device_ips(v)
                values[key] = ips
                values["device_ip_sources"] = sources
                values["device_ip_spans"] = spans
                values["device_ip_files"] = files
        values = {k: v for k, v in values.items() if v is not None}
        return ir.Cluster.model_construct(span=block.span, spans=self.spans_of(stmts), **values)

    def device_ips(self, expr):
        """`hccn("f")`, or a list with one entry per node: `hccn("f")` or a list of IPs.
        Returns the IPs per node, the files read, and per node the IPs' spans and file."""
        entries = [expr] if isinstance(expr, ast.Call) else None
        if isinstance(expr, ast.List):
            entries = list(expr.items)
            if entries and all(isinstance(e, ast.String) for e in entries):
                entries = [expr]  # one node written as a flat list of IPs
        if entries is None:
            self.err(
                "MSL108",
                'device_ips is `hccn("file")` or a list with one entry per ' "node",
                expr.span,
            )
            return None, (), (), ()
        nodes, sources, spans, files = [], [], [], []
        for entry in entries:
            if isinstance(entry, ast.Call) and entry.func.name == "hccn" and len(entry.args) == 1:
                path = self.string_value(entry.args[0], "the hccn.conf path")
                if path is None:
                    return None, (), (), ()
                ips = self.read_hccn(path, entry.span)
                if ips is None:
                    return None, (), (), ()
                nodes.append(ips)
                sources.append(path)
                spans.append(tuple(entry.span for _ in ips))
                files.append(path)
            elif isinstance(entry, ast.List):
                items = [self.string_value(i, "a device IP") for i in entry.items]
                if None in items:
                    return None, (), (), ()
                nodes.append(tuple(items))
                spans.append(tuple(i.span for i in entry.items))
                files.append(None)
            else:
                self.err(
                    "MSL108",
                    'each node\'s device IPs are `hccn("file")` or a list of ' "IPs",
                    entry.span,
                )
                return None, (), (), ()
        return tuple(nodes), tuple(sources), tuple(spans), tuple(files)

    def read_hccn(self, path: str, span: Span) -> tuple[str, ...] | None:
        try:
            data = read_regular(self.base_dir / path, HCCN_LIMIT)
        except OSError as exc:
            self.err(
                "MSL309",
                f"cannot read `{path}`: {exc.strerror or exc}",
                span,
                f"the path is relative to the spec's folder; hccn.conf is a regular file "
                f"of at most {format_bytes(HCCN_LIMIT)}",
            )
            return None
        self.sources.append(data)
        found: dict[int, str] = {}
        # lines end at \n alone (str.splitlines also breaks at \f, \x85, U+2028...);
        # digits, spaces and key characters are ASCII ones (`address_٣` is no device 3)
        for lineno, line in enumerate(data.decode("utf-8", "replace").split("\n"), 1):
            m = re.fullmatch(r"\s*address_0*(\d+)\s*=\s*(\S+)\s*", line, re.ASCII)
            if m and len(m.group(1)) > 9:  # never int() of 4,300 digits and more
                self.err("MSL309", f"`{path}` line {lineno} numbers a device past 10^9", span)
                return None
            if m:
                found[int(m.group(1))] = m.group(2)
            elif line.strip() and not re.match(r"\s*(#|\w+_\d+\s*=)", line, re.ASCII):
                # quote the key at most: the file may be anything (never its lines)
                key = re.match(r"\s*(\w{1,40})\s*=", line)
                what = f" (key {key.group(1)!r})" if key else ""
                self.err(
                    "MSL309",
                    f"`{path}` line {lineno} is not `key_N=value`{what}",
                    span,
                    "hccn.conf lines read `address_N=IP`",
                )
                return None
        if not found:
            self.err("MSL309", f"`{path}` has no `address_N=IP` lines", span)
            return None
        if sorted(found) != list(range(len(found))):
            self.err(
                "MSL309",
                f"`{path}` numbers its devices {sorted(found)}; expected "
                f"0..{len(found) - 1} without gaps",
                span,
            )
            return None
        return tuple(found[i] for i in range(len(found)))
