"""The front end in one place: text -> AST -> IR -> analysis and checks -> budget.

Every stage returns diagnostics; none raises on a bad spec.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from msgen.analysis.facts import Facts
from msgen.checks import INDEPENDENT_PASSES, STAGE_NAMES, checked
from msgen.diagnostics import Diagnostic, error, has_errors, printable
from msgen.estimate import budget
from msgen.ir.models import Spec
from msgen.ir.rederive import DEVICES_KEY, devices_problem, rederived, with_devices
from msgen.ir.schema import MODEL_KEYS
from msgen.lowering.lower import lower
from msgen.lowering.reader import names_in
from msgen.syntax import ast, parse, read_source
from msgen.syntax.overrides import apply_overrides, override_keys, recorded


@dataclass
class Result:
    """A spec's analysis: the text, the IR and facts if it lowered, every diagnostic."""

    file: str
    text: str
    spec: Spec | None = None
    facts: Facts | None = None
    diagnostics: list[Diagnostic] = field(default_factory=list)
    rederived: list[str] = field(default_factory=list)
    """What `--set` re-derived, e.g. `dp 4 → 2` (msgen.ir.rederive)."""
    kept: str = "the devices and the global batch"
    """What the re-derivation kept (a `--set cluster.devices`, `cluster.per_node` or
    `cluster.nodes` may change the devices: then it says by how much)."""
    sets: tuple[str, ...] = ()
    """The `--set` flags the analysis applied, as a compiled tree records them
    (msgen.syntax.overrides.recorded); the re-derived keys follow from them."""
    skipped: list[str] = field(default_factory=list)
    """The stages the errors found left unchecked, in order (STAGES)."""

    @property
    def ok(self) -> bool:
        return self.spec is not None and not has_errors(self.diagnostics)

    @property
    def stopped(self) -> str | None:
        """What the errors left unchecked, as a note says it; None when all was checked."""
        if not self.skipped or not has_errors(self.diagnostics):
            return None
        return "stopped early; not checked until the errors above are fixed: " + ", ".join(
            STAGE_WORDS.get(s, s) for s in self.skipped
        )


def _relative(path: Path) -> str | None:
    """The path relative to the current directory in posix form, or None outside it."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return None


def display_path(path: Path) -> str:
    """The spec as generated headers name it: relative to the current directory,
    or its file name when it lies outside (no machine path in committed code);
    escaped where it is not printable, so no file name can end a comment line in
    generated code."""
    return printable(_relative(path) or path.name)


def spec_label(path: Path) -> str:
    """The spec as messages name it: relative to the current directory, or the
    path as given when it lies outside, so two `x.msl` in different folders stay
    apart."""
    return printable(_relative(path) or path.as_posix())


STAGE_WORDS = {
    "values": "the blocks' values",
    "train": "training settings",
    "mtp": "multi-token prediction",
    "budget": "memory budget",
}
STAGES = (
    "values",  # lowering: the blocks' keys and values
    *STAGE_NAMES,
    *(p.__name__.rpartition(".")[2] for p in INDEPENDENT_PASSES),
    "budget",
)


# Lowering errors that leave the block's other values as written: an unknown key or a
# statement that does not belong is dropped, and nothing else reads it.
LEAVES_VALUES = {"MSL104"}


def broken_blocks(module, spec: Spec, diags: list[Diagnostic], file: str) -> frozenset[str] | None:
    """The blocks whose lowering reported an error, or that read a dim whose definition
    did (it is left out, silently, where it is used); None when an error lies outside
    the spec's blocks (a --set), so nothing further can be trusted."""
    broken = set()
    for d in diags:
        if not d.is_error or d.code in LEAVES_VALUES:
            continue
        if d.span is None or d.span.file != file:
            return None
        for kind, span in spec.block_spans.items():
            if span.line <= d.span.line <= span.end_line:
                broken.add(kind.split()[0])
    if "model" in broken:
        written = {s.target.name for b in module.blocks if b.kind.name == "model" for s in b.stmts
                   if isinstance(s, ast.Assign)}  # fmt: skip
        failed = written - set(spec.model.dims) - {"dtype", "param_dtype"}
        for block in module.blocks:
            if failed & set(names_in(block)):
                broken.add(block.kind.name)
    return frozenset(broken)


def _devices_what_if(overrides: list[str]) -> tuple[list[str], list[str]]:
    """The `--set cluster.devices=N` values apart from the other overrides."""
    keys = [o.partition("=")[0].replace(" ", "") for o in overrides]
    devices = [
        o.partition("=")[2] for o, k in zip(overrides, keys, strict=True) if k == DEVICES_KEY
    ]
    return [o for o, k in zip(overrides, keys, strict=True) if k != DEVICES_KEY], devices


def _lower(module, text: str, file: str, base_dir: Path, devices: str | None):
    """The IR, with the device what-if in place when there is one."""
    spec, diags = lower(module, text, file, base_dir)
    if spec is None or devices is None or has_errors(diags):
        return spec, diags
    problem = devices_problem(devices, spec.cluster.per_node)
    if problem is not None:
        return None, diags + [error("MSL108", f"--set {problem}", None)]
    return with_devices(spec, int(devices.strip().replace("_", ""))), diags


CLUSTER_KEYS = {"cluster.per_node", "cluster.nodes"}  # what a compile may change the devices by


def _kept(written, text: str, file: str, base_dir: Path, spec: Spec, kept: str) -> str:
    """What the note on re-derived keys says `--set` kept: the global batch only, and
    by how much the devices changed, when the cluster given has another count than
    the spec as written."""
    before, _ = lower(written, text, file, base_dir)
    if before is None:
        return kept
    old = before.cluster.per_node * len(before.cluster.nodes)
    new = spec.cluster.per_node * len(spec.cluster.nodes)
    return kept if old == new else f"the global batch (devices {old} → {new})"


def analyze_text(
    text: str, file: str, base_dir: Path, overrides: list[str] = (), what_if: bool = False
) -> Result:
    """`what_if`: the analysis is for estimating and planning only, so `--set
    cluster.devices` may make up servers (msgen.ir.rederive)."""
    result = Result(file=file, text=text)
    module, diags = parse(text, file)
    result.diagnostics += diags
    result.skipped = list(STAGES)  # until a stage runs
    if module is None:
        return result
    result.sets = recorded(list(overrides))
    overrides, devices = _devices_what_if(list(overrides))
    if devices and not what_if:
        result.diagnostics.append(
            error(
                "MSL104",
                f"--set {DEVICES_KEY} makes up the added servers' addresses, for estimate "
                "and plan only",
                None,
                "to compile for more devices, list every server's address in cluster.nodes "
                "(and its device IPs)",
            )
        )
        return result
    if len(devices) > 1:
        result.diagnostics.append(error("MSL001", f"--set {DEVICES_KEY} is given twice", None))
        return result
    devices = devices[0] if devices else None
    written = module
    if overrides:
        module, diags = apply_overrides(module, list(overrides), {"model": MODEL_KEYS})
        result.diagnostics += diags
        if has_errors(diags):
            return result
    spec, diags = _lower(module, text, file, base_dir, devices)
    given = override_keys(list(overrides)) | ({DEVICES_KEY} if devices is not None else set())
    if devices is not None:
        result.kept = "the global batch"
    if spec is not None and given & CLUSTER_KEYS and not has_errors(diags):
        result.kept = _kept(written, text, file, base_dir, spec, result.kept)
    if spec is not None and given and not has_errors(diags):
        sets, result.rederived = rederived(spec, given)
        if sets:
            module, _ = apply_overrides(module, sets)
            spec, diags = _lower(module, text, file, base_dir, devices)
    result.diagnostics += diags
    return _check(result, module, spec, has_errors(diags))


def _check(result: Result, module, spec: Spec | None, lowering_failed: bool) -> Result:
    """The check passes and the budget, on a spec that lowered; where lowering found
    errors, the passes their blocks do not reach (msgen.checks.checked)."""
    broken = frozenset()
    if spec is not None and lowering_failed:
        broken = broken_blocks(module, spec, result.diagnostics, result.file)
    if spec is None or broken is None:
        result.skipped = list(STAGES[1:])
        return result
    facts, diags, result.skipped = checked(spec, broken)
    result.diagnostics += diags
    if not lowering_failed:
        result.spec, result.facts = spec, facts
    if has_errors(result.diagnostics):
        result.skipped.append("budget")
        return result
    # the estimate needs the graph's layouts, a valid pipeline and a known device
    result.diagnostics += budget.run(spec, facts)
    return result


def analyze(path: Path, overrides: list[str] = (), what_if: bool = False) -> Result:
    """Read and check one spec file (the caller handles a file that cannot be read)."""
    text = read_source(path)
    return analyze_text(text, spec_label(path), path.parent, overrides, what_if)


def estimable(result) -> bool:
    """The spec has no error but a budget one: estimate and plan can still run."""
    return result.spec is not None and not any(
        d.is_error and not d.code.startswith("MSL4") for d in result.diagnostics
    )
