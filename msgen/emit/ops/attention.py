"""`attention`'s code (msgen/ops/attention.py): one Attention cell for the model,
templates/ops/attention.py.j2."""

from __future__ import annotations

import json

from msgen.emit.ops.base import OpEmitter, Snippet, strategy_keywords
from msgen.emit.ops.cell_choices import CellChoices
from msgen.ops.attention import rope_scaling
from msgen.ops.attention_geometry import AttentionGeometry
from msgen.ops.rope_scaling import scaled_rope_values


def scaling_source(items) -> str:
    """The scaling's items (`rope_scaling(node)`) as a Python dict literal, strings in
    black's double quotes: the generated cell's `rope_scaling` argument."""

    def py(value) -> str:
        return json.dumps(value) if isinstance(value, str) else repr(value)

    return "{" + ", ".join(f"{json.dumps(k)}: {py(v)}" for k, v in items) + "}"


class Attention(OpEmitter):
    kind = "attention"
    helpers = ("attention",)

    def settings(self, node, ctx):
        g = AttentionGeometry.of(node, ctx)
        return {
            "heads": g.heads,
            "kv_heads": g.kv_heads,
            "head_dim": g.head_dim,
            "causal": self.arg(node, "causal"),
            "rope": self.arg(node, "rope"),
            "rope_theta": float(self.arg(node, "rope_theta")),
            "rope_scaling": rope_scaling(node),
            "window": node.args.get("window"),
            "flash": self.arg(node, "flash"),
            "p": float(self.arg(node, "dropout")),
            "qk_norm": self.arg(node, "qk_norm"),
        }

    def helper_values(self, ops):
        # One Attention cell serves the model: it takes `flash` when any op asks for it,
        # builds dropout primitives when any op drops out, q/k norms when any has them,
        # and carries the scaled frequencies' source when any scales rope.
        scaled = scaled_rope_values(ops)
        if scaled["rope_scaling"]:
            rope = "scaled"
        else:
            rope = "fused" if any(op.setting("rope") for op in ops) else "composed"
        cell = CellChoices.of(
            "ops/attention",
            rope=rope,
            kernel="flash" if any(op.setting("flash") for op in ops) else "composed",
            qk_norm="rms" if any(op.setting("qk_norm") for op in ops) else "none",
        )
        return {
            "cell": cell,
            "dropout": any(op.setting("p") > 0 for op in ops),
            "rope_frequencies": scaled["rope_frequencies"],
        }

    def code(self, op, model):
        (qkv,) = op.inputs
        s = op.setting
        extra = strategy_keywords(op, ("flash",) if s("flash") else ())
        extra += ", qk_norm=True" if s("qk_norm") else ""
        if s("rope_scaling"):
            extra += f", rope_scaling={scaling_source(s('rope_scaling'))}"
        extra += strategy_keywords(op, ("rope_kernel",) if s("rope") else ())
        make = (
            f"Attention(heads={s('heads')}, kv_heads={s('kv_heads')}, head_dim={s('head_dim')}, "
            f"seq={model.seq}, causal={s('causal')}, rope={s('rope')}, "
            f"rope_theta={s('rope_theta')!r}, window={s('window')}, p={s('p')!r}, "
            f"scores={op.strategy('scores')}{extra})"
        )
        return Snippet(make, f"self.{op.name}({qkv})", "attention")
