"""The spec's settings side by side: every key of the model, cluster, mesh,
pipeline, train and budget blocks, each layer's recompute and each fusion group,
as resolved by lowering (dims evaluated), with the line that sets it."""

from __future__ import annotations

from enum import Enum

from msgen.diagnostics import Span, format_bytes
from msgen.ir.models import Block, Call, Checkpoint, Spec
from msgen.review.model import SettingChange

BLOCKS = ("model", "cluster", "mesh", "pipeline", "train", "budget")
# Where lowering keeps spans and the files IPs came from: not settings.
NOT_SETTINGS = {"span", "spans", "dims", "node_spans", "device_ip_spans", "device_ip_files",
                "device_ip_sources"}  # fmt: skip


def show(value) -> str | None:
    """A setting's value as MSL writes it."""
    if value is None:
        return None
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return "[" + ", ".join(f'"{v}"' if isinstance(v, str) else show(v) for v in value) + "]"
    if isinstance(value, Call):
        return f"{value.name}(" + ", ".join(f"{k} = {show(v)}" for k, v in value.args.items()) + ")"
    if isinstance(value, Checkpoint):
        return f"every {value.every} keep {value.keep}"
    return str(value)


def _line(span: Span | None) -> int | None:
    return span.line if span else None


def _block(name: str, block: Block) -> dict[str, tuple[str | None, int | None]]:
    out = {}
    for key in type(block).model_fields:
        if key in NOT_SETTINGS:
            continue
        value = getattr(block, key)
        text = format_bytes(value) if key == "device_memory" and value else show(value)
        span = block.span if key == "name" else block.spans.get(key)
        out[f"{name}.{key}"] = (text, _line(span))
        if key == "name":  # the model's dims follow its name, in the order written
            for dim, size in getattr(block, "dims", {}).items():
                out[f"{name}.{dim}"] = (str(size), _line(block.spans.get(dim)))
    return out


def settings(spec: Spec) -> dict[str, tuple[str | None, int | None]]:
    """Every setting: `BLOCK.KEY` -> (value as written, line or None for a default)."""
    out = {}
    for name in BLOCKS:
        out |= _block(name, getattr(spec, name))
    for layer, rc in spec.recompute.items():
        mode = show(rc.mode)
        if rc.ops:
            mode += "(" + ", ".join(r.name for r in rc.ops) + ")"
        out[f"recompute.{layer}"] = (mode, rc.span.line)
    for g in spec.fusion:
        buckets = f" buckets {g.buckets}" if g.buckets != 1 else ""
        out[f"fusion.{g.name}"] = (f"{show(g.kind)} {show(g.patterns)}{buckets}", g.span.line)
    return out


def compare_settings(old: Spec, new: Spec, set_keys: set[str]) -> list[SettingChange]:
    """The settings whose values differ, in NEW's order, then those only OLD has."""
    a, b = settings(old), settings(new)
    out = []
    for key in [*b, *(k for k in a if k not in b)]:
        (old_text, old_line), (new_text, new_line) = a.get(key, (None, None)), b.get(
            key, (None, None)
        )
        if old_text != new_text:
            out.append(
                SettingChange(
                    setting=key,
                    old=old_text,
                    new=new_text,
                    old_line=old_line,
                    new_line=new_line,
                    new_by_option=key in set_keys,
                )
            )
    return out
