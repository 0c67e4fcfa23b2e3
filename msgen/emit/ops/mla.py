"""`mla`'s code (msgen/ops/mla.py): one MLA cell for the model, templates/ops/mla.py.j2."""

from __future__ import annotations

from msgen.emit.ops.attention import scaling_source
from msgen.emit.ops.base import OpEmitter, Snippet, strategy_keywords
from msgen.emit.ops.cell_choices import CellChoices
from msgen.ops.attention import rope_scaling
from msgen.ops.mla import softmax_scale
from msgen.ops.mla_geometry import MlaGeometry
from msgen.ops.rope_scaling import scaled_rope_values


class Mla(OpEmitter):
    kind = "mla"
    helpers = ("mla",)

    def settings(self, node, ctx):
        g = MlaGeometry.of(node)
        return {
            "heads": g.heads,
            "q_lora_rank": g.q,
            "kv_lora_rank": g.kv,
            "nope": g.nope,
            "rope": g.rope,
            "v_head_dim": g.v,
            "rope_theta": float(self.arg(node, "rope_theta")),
            "interleave": self.arg(node, "rope_interleave"),
            "rope_scaling": rope_scaling(node),
            "scale": softmax_scale(node),
            "eps": float(self.arg(node, "eps")),
            "flash": self.arg(node, "flash"),
        }

    def helper_values(self, ops):
        # One MLA cell serves the model: flash when any op asks for it, and the scaled
        # frequencies' source when any scales rope.
        scaled = scaled_rope_values(ops)
        cell = CellChoices.of(
            "ops/mla",
            rope="scaled" if scaled["rope_scaling"] else "plain",
            kernel="flash" if any(op.setting("flash") for op in ops) else "composed",
        )
        return {"cell": cell, "rope_frequencies": scaled["rope_frequencies"]}

    def code(self, op, model):
        (x,) = op.inputs
        s = op.setting
        hidden = op.params[0].shape[0]
        make = (
            f"MLA({hidden}, heads={s('heads')}, q_lora_rank={s('q_lora_rank')}, "
            f"kv_lora_rank={s('kv_lora_rank')}, nope={s('nope')}, rope={s('rope')}, "
            f"v_head_dim={s('v_head_dim')}, seq={model.seq}, "
            f"rope_theta={s('rope_theta')!r}, interleave={s('interleave')}, "
            f"scale={s('scale')!r}, eps={s('eps')!r}"
        )
        make += strategy_keywords(op, (role for role, _ in op.strategies))
        if s("rope_scaling"):
            make += f", rope_scaling={scaling_source(s('rope_scaling'))}"
        if s("flash"):
            make += ", flash=True"
        return Snippet(make + ")", f"self.{op.name}({x})", "mla")
