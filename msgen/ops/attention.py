"""`attention(qkv, heads, kv_heads, causal, rope, flash, dropout)` over a fused QKV.

qkv is [batch, seq, (heads + 2 * kv_heads) * head_dim], laid out per kv group
(its query heads, then its k, then its v), so a split of the last dim splits
whole groups. Output is [batch, seq, heads * head_dim].
"""

from __future__ import annotations

from msgen.ops.base import Arg, Layout, OpDef, OpError, Saved, out_declared
from msgen.ops.linear import without


def head_dim(node, ctx) -> int:
    if "head_dim" in ctx.dims:
        return ctx.dims["head_dim"]
    return ctx.dims.get("hidden", 0) // node.args["heads"]


def kv_heads(node) -> int:
    return node.args.get("kv_heads") or node.args["heads"]


class Attention(OpDef):
    name = "attention"
    args = (
        Arg("qkv", "tensor"),
        Arg("heads", "int"),
        Arg("kv_heads", "int", None),
        Arg("causal", "bool", False),
        Arg("rope", "bool", False),
        Arg("flash", "bool", False),
        Arg("dropout", "float", 0.0, within="[0, 1)"),
    )
    composite = True

    def shape(self, node, inputs, ctx):
        (qkv,) = inputs
        heads, groups = node.args["heads"], kv_heads(node)
        if len(qkv) != 3:
            raise OpError("MSL116", f"attention needs [batch, seq, width], got {list(qkv)}", "qkv")
        if heads % groups:
            raise OpError(
                "MSL119", f"heads = {heads} is not a multiple of kv_heads = {groups}", "kv_heads"
            )
        hd = head_dim(node, ctx)
        if hd <= 0:
            raise OpError("MSL119", "head_dim must be positive", "heads")
        want = (heads + 2 * groups) * hd
        if qkv[-1] != want:
            raise OpError(
                "MSL119",
                f"qkv width is {qkv[-1]}, but (heads + 2 * kv_heads) * head_dim = "
                f"({heads} + 2 * {groups}) * {hd} = {want}",
                "qkv",
                "project to (heads + 2 * kv_heads) * head_dim, or define `head_dim` in the model",
            )
        return qkv[:-1] + (heads * hd,)

    def layout(self, node, inputs, out_shape, ctx):
        (qkv,) = inputs
        decl = out_declared(node, 3)
        sb, _, sh = decl or qkv.split
        sb = without((sb,), sh)[0]
        # attention needs whole sequences: a seq split is gathered in front
        need = (sb, (), sh)
        return Layout(inputs=(need,), output=need)

    def divisible(self, node, layout, ctx):
        sh = layout.output[-1]
        return [("heads", node.args["heads"], sh), ("kv_heads", kv_heads(node), sh)]

    def saves(self, node, inputs, output, ctx):
        (qkv,) = inputs
        b, s, _ = qkv.shape
        heads = node.args["heads"]
        sb, _, sh = output.split
        item = ctx.dtype_bytes
        if node.args.get("rope"):
            # backward needs the rotated q and k (and v): a tensor of qkv's size
            saved = [Saved(f"{node.name}.qkv_rope", qkv.shape, qkv.split, item, "internal")]
        else:
            saved = [Saved(node.inputs[0].name, qkv.shape, qkv.split, item, "input")]
        if node.args.get("flash"):
            lse = Saved(f"{node.name}.lse", (b, heads, s), (sb, sh, ()), 4, "internal")
            out = Saved(node.name, output.shape, output.split, item, "output")
            return saved + [out, lse]
        scores = (b, heads, s, s)
        split = (sb, sh, (), ())
        saved.append(Saved(f"{node.name}.probs", scores, split, item, "internal"))
        if node.args.get("dropout"):
            saved.append(Saved(f"{node.name}.mask", scores, split, 1, "internal"))
            saved.append(Saved(f"{node.name}.dropped", scores, split, item, "internal"))
        return saved
