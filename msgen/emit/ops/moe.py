"""`moe`'s code (msgen/ops/moe.py): one MoE cell for the model, templates/ops/moe.py.j2
and its fragments (routing, capacity, the permuting dispatcher)."""

from __future__ import annotations

from msgen.emit.ops.base import OpEmitter, Snippet, strategy_keywords
from msgen.ops import moe_routing as routing
from msgen.ops.moe_geometry import devices
from msgen.ops.moe_rows import maps_source


def routing_settings(node) -> dict:
    """The router's choices as the generated cell takes them (msgen/ops/moe_routing.py)."""
    g, top = routing.groups(node)
    value = routing.value
    return {
        "sigmoid": value(node, "router") == "sigmoid",
        "norm_topk": value(node, "norm_topk"),
        "scaling": float(value(node, "routed_scaling")),
        "bias_rate": float(value(node, "bias_rate")) if value(node, "expert_bias") else None,
        "expert_groups": (g, top, value(node, "group_score")) if top < g else None,
        "seq_aux_loss": float(value(node, "seq_aux_loss")),
    }


def routing_keywords(s) -> str:
    """The generated cell's routing arguments past the default (plain top-k) ones."""
    out = ""
    if s("scaling") != 1.0:
        out += f", scaling={s('scaling')!r}"
    if s("bias_rate") is not None:
        out += f", bias_rate={s('bias_rate')!r}"
    if s("expert_groups") is not None:
        g, top, score = s("expert_groups")
        out += f', expert_groups=({g}, {top}, "{score}")'
    return out


class Moe(OpEmitter):
    kind = "moe"
    helpers = ("moe",)

    def settings(self, node, ctx):
        capacity = node.args.get("capacity")
        return {
            "experts": node.args["experts"],
            "top_k": node.args["top_k"],
            "ffn": node.args["ffn"],
            "shared_ffn": self.arg(node, "shared_ffn"),
            "gated": self.arg(node, "activation") == "swiglu",
            **routing_settings(node),
            "capacity": None if capacity is None else float(capacity),
            "by_position": self.arg(node, "drop") == "position",
            "permute": self.op.dropless(node),
            # the Layouts' devices: the capacity path's always (its groups are dp),
            # the dropless region's under semi-auto
            "devices": devices(ctx) if capacity is not None or ctx.semi_auto else None,
            "aux_loss": float(self.arg(node, "aux_loss")),
            "z_loss": float(self.arg(node, "z_loss")),
        }

    def helper_values(self, ops):
        # The MoE cell has the permuting dispatcher when some op of the model permutes.
        # update_expert_bias when some moe op of the model has a correction bias
        return {
            "permute": any(op.setting("permute") for op in ops),
            "biased": any(op.setting("bias_rate") is not None for op in ops),
        }

    def code(self, op, model):
        (x,) = op.inputs
        s = op.setting
        hidden = op.params[0].shape[0]
        make = (
            f"MoE({hidden}, {s('experts')}, {s('top_k')}, {s('ffn')}, {s('shared_ffn')}, "
            f"gated={s('gated')}, sigmoid={s('sigmoid')}, norm_topk={s('norm_topk')}, "
            f"capacity={s('capacity')!r}, by_position={s('by_position')}"
        )
        shared = (role for role, _ in op.strategies if role.startswith("shared_"))
        make += strategy_keywords(op, ("router", *shared))
        if s("capacity") is not None:
            inner, outer = (maps_source(op.strategy(role)) for role in ("inner", "outer"))
            make += f", inner={inner}, outer={outer}"
        if s("devices"):
            make += f", devices={s('devices')}"
        make += routing_keywords(s)
        aux = s("aux_loss") > 0 or s("z_loss") > 0 or s("seq_aux_loss") > 0
        if aux:
            make += f", aux_loss={s('aux_loss')!r}, z_loss={s('z_loss')!r}"
        if s("seq_aux_loss") > 0:
            make += f", seq_aux_loss={s('seq_aux_loss')!r}"
        return Snippet(make + ")", f"self.{op.name}({x})", "moe", aux=aux)
