"""`train.mtp`: its arguments, and a network the modules can share ops with
(msgen/analysis/mtp.py)."""

from __future__ import annotations

from msgen.analysis.facts import Facts
from msgen.analysis.mtp import call_of, shared_ops
from msgen.diagnostics import Diagnostic, did_you_mean, error
from msgen.ir.models import Spec
from msgen.ir.schema import MTP

SIGNATURE = "mtp(depth = 1, weight = 0.1, layer = NAME)"


def run(spec: Spec, facts: Facts) -> list[Diagnostic]:
    call = call_of(spec)
    if call is None:
        return []
    if call.name != "mtp":
        span = spec.train.spans.get("mtp", call.span)
        return [error("MSL530", f"unknown mtp setting `{call.name}`", span, f"write {SIGNATURE}")]
    known = MTP["mtp"]
    diags = []

    def bad(arg: str, message: str, hint: str | None = None) -> None:
        diags.append(error("MSL530", message, call.arg_spans.get(arg, call.span), hint))

    for arg in call.args:
        if arg not in known:
            bad(arg, f"mtp has no argument `{arg}`", did_you_mean(arg, known) or SIGNATURE)
    depth, weight = call.args.get("depth", 1), call.args.get("weight", 0.1)
    seq = spec.model.dims.get("seq", 0)
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth < max(seq, 2):
        bad(
            "depth",
            f"depth = {str(depth).lower()} must be a whole number from 1 to seq - 1",
            "depth is how many further tokens the modules predict, one module each "
            "(DeepSeek-V3 trains with 1)",
        )
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not weight >= 0:
        bad(
            "weight",
            f"weight = {str(weight).lower()} must be a number >= 0",
            "the loss adds weight / depth times the modules' summed losses "
            "(DeepSeek-V3: 0.3, then 0.1)",
        )
    layer = call.args.get("layer")
    repeated = [op.args["layer"] for op in spec.network.ops if op.kind == "repeat"]
    if layer is not None and layer not in repeated:
        bad(
            "layer",
            f"layer = {str(layer).lower()} is not a layer the network repeats",
            did_you_mean(str(layer), repeated) or f"the network repeats: {', '.join(repeated)}",
        )
    if not repeated:
        bad("layer", "mtp needs a network that repeats a layer: each module runs one copy")
    shared = shared_ops(spec)
    chosen = layer if layer is not None else (repeated[-1] if repeated else None)
    if shared is not None and chosen in repeated and not layer_fits(facts, shared.norm, chosen):
        bad(
            "layer",
            f"layer `{chosen}` does not map the final norm's [batch, seq, hidden] to itself, "
            "so a module cannot run a copy of it between eh_proj and its norm",
            "name a layer with that input and output shape: `layer = NAME`",
        )
    if shared is None:
        diags.append(
            error(
                "MSL531",
                "mtp needs a network that ends `logits = linear(h, vocab, bias = false)` (or "
                "tied) over a layernorm or rmsnorm `h`, with `output cross_entropy(logits, "
                "tokens)` and an `embedding` of the tokens",
                spec.train.spans.get("mtp", call.span),
                "the modules share the embedding table and the output layer, and take the "
                "final norm's kind for their own norms",
            )
        )
    return diags


def layer_fits(facts: Facts, norm: str, layer: str) -> bool:
    """Whether the layer's input and output have the final norm's output shape (true
    when the shapes are not known: an earlier pass reported why)."""
    graph, net = facts.graphs.get(layer), facts.graphs.get("network")
    if graph is None or net is None or norm not in net.shapes or graph.graph.input is None:
        return True
    out = graph.shapes.get(graph.graph.output or "")
    return out is None or tuple(graph.graph.input.shape) == tuple(net.shapes[norm]) == tuple(out)
