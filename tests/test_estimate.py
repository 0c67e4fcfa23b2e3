"""The memory model: what each op saves, recompute, precision, ZeRO, schedules,
the per-stage rows, exact parameter counts, and the published numbers of
reference/estimator.md reproduced to the byte."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest

from msgen.analysis.plan import Plan
from msgen.compiler import analyze, analyze_text
from msgen.estimate.activations import kept_saves
from msgen.estimate.memory import (
    GiB,
    MiB,
    estimate,
    in_flight,
    param_states,
    precision,
)
from msgen.ops.base import Param, Saved

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs"

GPT_LAYER = """
    input x : [batch, seq, hidden] @ [dp, 1, 1]
    ln1  = layernorm(x)
    qkv  = linear(ln1, 3 * hidden) weight @ [1, tp]
    att  = attention(qkv, heads = heads, causal = true, dropout = 0.1) @ [dp, 1, tp]
    proj = linear(att, hidden) weight @ [tp, 1]
    d1   = dropout(proj, 0.1)
    h    = x + d1
    ln2  = layernorm(h)
    up   = linear(ln2, ffn) weight @ [1, tp]
    act  = gelu(up)
    down = linear(act, hidden) weight @ [tp, 1]
    d2   = dropout(down, 0.1)
    output h + d2
"""

GPT_NETWORK = """
    input tokens : [batch, seq] @ [dp, 1]
    emb    = embedding(tokens, vocab, hidden) table @ [tp, 1]
    pos    = positions(seq, hidden)
    x      = emb + pos
    body   = repeat decoder(x) layers
    norm   = layernorm(body)
    logits = linear(norm, vocab, tie = emb)
    output cross_entropy(logits, tokens)
"""


def spec_text(
    *,
    dp=1,
    tp=1,
    pp=1,
    layers=4,
    micro_batch=1,
    micro_batches=1,
    schedule="1f1b",
    zero=0,
    recompute="none",
    dims="vocab = 512\n hidden = 64\n heads = 4\n ffn = 4 * hidden\n seq = 32",
    dtype="bf16",
    param_dtype="fp32",
    train_extra="",
    budget=None,
    device="ascend910b",
    layer=GPT_LAYER,
    network=GPT_NETWORK,
    extra="",
) -> str:
    """A complete, valid spec; every keyword is one setting."""
    devices = dp * tp * pp
    per_node = min(8, devices)
    nodes = ", ".join(f'"10.0.0.{i + 1}"' for i in range(devices // per_node))
    budget_block = f"budget {{\n device_memory = {budget}\n}}\n" if budget else ""
    return f"""msl 0.1
model m {{
 {dims}
 layers = {layers}
 dtype = {dtype}
 param_dtype = {param_dtype}
}}
cluster {{
 device = {device}
 per_node = {per_node}
 nodes = [{nodes}]
}}
mesh {{
 dp = {dp}
 tp = {tp}
 pp = {pp}
}}
layer decoder {{{layer}}}
network {{{network}}}
recompute {{
 decoder = {recompute}
}}
pipeline {{
 micro_batches = {micro_batches}
 schedule = {schedule}
}}
train {{
 micro_batch = {micro_batch}
 global_batch = {micro_batch * dp * micro_batches}
 optimizer = adamw(lr = 1e-4)
 schedule = cosine(warmup = 10, steps = 100)
 zero = {zero}
 {train_extra}
}}
{budget_block}{extra}"""


def checked(text: str, overrides=()):
    result = analyze_text(text, "t.msl", ROOT, list(overrides))
    errors = [d for d in result.diagnostics if d.is_error and not d.code.startswith("MSL4")]
    assert not errors, errors
    return result


def estimate_of(text: str, overrides=()):
    result = checked(text, overrides)
    return estimate(Plan(result.spec, result.facts))


def estimate_file(path: Path, overrides=()):
    result = analyze(path, list(overrides))
    return estimate(Plan(result.spec, result.facts))


# what each op saves -----------------------------------------------------------

B, S, H, A = 2, 32, 64, 4  # batch (micro_batch 1 x dp 2), seq, hidden, heads
DP = (("dp",), (), ())


def saves_of(layer: str, **kw) -> dict[str, list[Saved]]:
    result = checked(spec_text(dp=2, tp=2, layer=layer, **kw))
    return {name: of.saves for name, of in result.facts.graphs["decoder"].ops.items()}


def test_gpt_layer_saves_per_op():
    saves = saves_of(GPT_LAYER)
    col = (("dp",), (), ("tp",))
    assert saves["ln1"] == [Saved("x", (B, S, H), DP, 2, "input")]
    assert saves["qkv"] == [Saved("ln1", (B, S, H), DP, 2, "input")]
    assert saves["att"] == [
        Saved("qkv", (B, S, 3 * H), col, 2, "input"),
        Saved("att.probs", (B, A, S, S), (("dp",), ("tp",), (), ()), 2, "internal"),
        Saved("att.mask", (B, A, S, S), (("dp",), ("tp",), (), ()), 1, "internal"),
        Saved("att.dropped", (B, A, S, S), (("dp",), ("tp",), (), ()), 2, "internal"),
    ]
    assert saves["proj"] == [Saved("att", (B, S, H), col, 2, "input")]
    assert saves["d1"] == [Saved("d1.mask", (B, S, H), DP, 1, "internal")]
    assert saves["h"] == []
    assert saves["act"] == [Saved("up", (B, S, 4 * H), col, 2, "input")]
    assert saves["down"] == [Saved("act", (B, S, 4 * H), col, 2, "input")]


def test_flash_attention_saves_output_and_fp32_softmax_statistics():
    layer = GPT_LAYER.replace("dropout = 0.1)", "flash = true)")
    col = (("dp",), (), ("tp",))
    heads = (("dp",), ("tp",), (), ())
    expected = [
        Saved("qkv", (B, S, 3 * H), col, 2, "input"),
        Saved("att", (B, S, H), col, 2, "output"),
        Saved("att.softmax_max", (B, A, S, 8), heads, 4, "internal"),
        Saved("att.softmax_sum", (B, A, S, 8), heads, 4, "internal"),
    ]
    assert saves_of(layer)["att"] == expected
    dropped = GPT_LAYER.replace("dropout = 0.1)", "flash = true, dropout = 0.1)")
    bits = Saved("att.keep_bits", (B, A, S, S // 8), heads, 1, "internal")
    assert saves_of(dropped)["att"] == expected + [bits]


def test_rope_attention_saves_rotated_qkv_not_its_input():
    layer = GPT_LAYER.replace("dropout = 0.1)", "rope = true)")
    att = saves_of(layer)["att"]
    assert [(s.key, s.role) for s in att] == [
        ("att.qkv_rope", "internal"),
        ("att.probs", "internal"),
    ]


def test_other_elementwise_ops():
    layer = """
    input x : [batch, seq, hidden] @ [dp, 1, 1]
    n    = rmsnorm(x)
    up   = linear(n, 2 * ffn, bias = false) weight @ [1, tp]
    sw   = swiglu(up)
    s    = silu(sw)
    m    = s * sw
    c    = m * 0.5
    off  = dropout(c, 0.0)
    down = linear(off, hidden, bias = false) weight @ [tp, 1]
    output x + down
"""
    saves = saves_of(layer)
    col = (("dp",), (), ("tp",))
    assert saves["n"] == [Saved("x", (B, S, H), DP, 2, "input")]
    assert saves["sw"] == [Saved("up", (B, S, 8 * H), col, 2, "input")]  # both halves
    assert saves["s"] == [Saved("sw", (B, S, 4 * H), col, 2, "input")]
    assert saves["m"] == [
        Saved("s", (B, S, 4 * H), col, 2, "input"),
        Saved("sw", (B, S, 4 * H), col, 2, "input"),
    ]
    assert saves["c"] == []  # times a constant
    assert saves["off"] == []  # p = 0: no mask
    assert saves["output"] == []


def test_network_ops_save_token_ids_and_the_loss_tensors():
    result = checked(spec_text(dp=2, tp=2))
    ops = result.facts.graphs["network"].ops
    assert ops["emb"].saves == [Saved("tokens", (B, S), (("dp",), ()), 4, "input")]
    assert ops["pos"].saves == []
    logits = (("dp",), (), ("tp",))  # vocab-parallel: the loss keeps the vocab split
    assert ops["output"].saves == [
        Saved("output.exp", (B, S, 512), logits, 4, "internal"),
        Saved("output.mask", (B, S, 512), logits, 1, "internal"),
        Saved("output.sum", (B, S), logits[:-1], 4, "internal"),
    ]


# recompute --------------------------------------------------------------------


def kept(recompute: str) -> list[str]:
    result = checked(spec_text(dp=2, tp=2, recompute=recompute))
    return list(kept_saves(result.facts.graphs["decoder"], result.spec.recompute["decoder"]))


def test_recompute_none_keeps_every_distinct_tensor_once():
    assert kept("none") == [
        "x", "ln1", "qkv", "att.probs", "att.mask", "att.dropped", "att", "d1.mask",
        "h", "ln2", "up", "act", "d2.mask",
    ]  # fmt: skip


def test_recompute_full_keeps_the_layer_input():
    assert kept("full") == ["x"]


def test_select_composite_keeps_inputs_and_output():
    # the attention core's own tensors go; qkv (its input) and att (its output,
    # which proj saves) stay
    assert kept("select(att)") == [
        "x", "ln1", "qkv", "att", "d1.mask", "h", "ln2", "up", "act", "d2.mask",
    ]  # fmt: skip


def test_select_primitive_drops_its_output_everywhere():
    # gelu saved only its input; `down` would keep act, which is recomputed from up
    assert "act" not in kept("select(act)")
    assert "up" in kept("select(act)")


def test_select_keeps_a_named_op_input_nobody_saved():
    # dropout saves only its mask; rerunning it needs proj
    names = kept("select(d1)")
    assert "d1.mask" not in names and "proj" in names


def test_select_a_chain_keeps_only_its_frontier():
    names = kept("select(up, act)")
    assert "act" not in names and "up" not in names and "ln2" in names


# precision and ZeRO -----------------------------------------------------------


def bytes_per_param(**train) -> int:
    return precision(checked(spec_text(**train)).spec).per_param


def test_precision_setups():
    assert bytes_per_param() == 16  # MindSpore default: fp32 params, grads, Adam
    megatron = dict(param_dtype="fp16", train_extra="master_weights = fp32\n grad_dtype = fp32")
    assert bytes_per_param(**megatron) == 18
    assert bytes_per_param(param_dtype="bf16") == 12  # bf16 weights and grads, no master
    same = dict(train_extra="master_weights = fp32")  # fp32 params are their own master
    assert bytes_per_param(**same) == 16


BIG = Param("w", (1024, 1024), ((), ()))  # 4 MiB in fp32
SMALL = Param("b", (1024,), ((),))  # 4 KiB: under hsdp's 64 KiB threshold
ODD = Param("o", (1023, 64), ((), ()))  # first dim 1023: dp 4 does not divide it


# Bytes per element of BIG (fp32 weights and grads, Adam m and v fp32) at dp = 4, from
# MindSpore's definitions of the parallel optimizer levels: every level stores a 1/dp
# weight slice and slices the optimizer states (hsdp's docstring,
# mindspore/parallel/auto_parallel.py); levels 1 and 2 also hold the whole weight
# all-gathered in forward until backward (level 3's docstring: it gathers again "to
# release the memory used by the forward pass allgather"); the AllGather's backward is a
# ReduceScatter, so the gradient is the slice (get_bprop_all_gather,
# ops/_grad_experimental/grad_comm_ops.py); level 2 alone sets
# gradient_accumulation_shard, slicing the accumulation buffer
# (set_parallel_optimizer_config, mindspore/parallel/_auto_parallel_context.py).
@pytest.mark.parametrize(
    "zero, weights, grads, accumulation, optimizer",
    [
        (0, 4, 4, 4, 8),
        (1, 4 + 1, 1, 4, 2),
        (2, 4 + 1, 1, 1, 2),
        (3, 1, 1, 4, 2),
    ],
)
def test_zero_levels(zero, weights, grads, accumulation, optimizer):
    prec = precision(checked(spec_text()).spec)
    n = 1024 * 1024
    st = param_states([BIG], {"dp": 4, "tp": 1}, prec, zero)
    assert (st.params, st.weights, st.grads, st.accumulation, st.optimizer) == (
        n,
        weights * n,
        grads * n,
        accumulation * n,
        optimizer * n,
    )
    whole = param_states([SMALL, ODD], {"dp": 4, "tp": 1}, prec, zero)
    assert whole == param_states([SMALL, ODD], {"dp": 4, "tp": 1}, prec, 0)


def test_params_divide_by_their_own_split():
    prec = precision(checked(spec_text()).spec)
    col = Param("w", (64, 256), ((), ("tp",)))
    norm = Param("g", (64,), ((),))
    st = param_states([col, norm], {"dp": 1, "tp": 4}, prec, 0)
    assert st.params == 64 * 256 // 4 + 64


def test_zero_1_with_a_master_copy():
    # fp16 weights, fp32 master and grads: the fp16 slice and the gathered whole, the
    # fp32 gradient slice, the master copy and Adam's m and v sliced: 2 + 2/d + 4/d +
    # 12/d bytes per parameter (Megatron's distributed optimizer, 6 + 12/d, keeps its
    # fp32 gradient buffer whole: MindSpore reduce-scatters the gradient instead).
    prec = precision(
        checked(
            spec_text(param_dtype="fp16", train_extra="master_weights = fp32\n grad_dtype = fp32")
        ).spec
    )
    st = param_states([BIG], {"dp": 4}, prec, 1)
    assert st.weights + st.grads + st.optimizer == (2 * 4 + 2 + 4 + 12) * 1024 * 1024 // 4


# schedules --------------------------------------------------------------------


def flights(**kw) -> list[Fraction]:
    est = estimate_of(spec_text(**kw))
    return [s.in_flight_micro_batches for s in est.stages]


def test_1f1b_in_flight():
    assert flights(pp=4, layers=8, micro_batches=8) == [4, 3, 2, 1]
    assert flights(pp=4, layers=8, micro_batches=4) == [4, 3, 2, 1]


def test_gpipe_keeps_every_micro_batch():
    assert flights(pp=2, layers=4, micro_batches=6, schedule="gpipe") == [6, 6]


def test_one_stage_runs_micro_batches_one_at_a_time():
    for schedule in ("1f1b", "gpipe"):
        assert flights(micro_batches=8, schedule=schedule) == [1]


def test_interleaved_first_stage_penalty():
    p, m = 4, 2
    got = flights(pp=p, layers=16, micro_batches=16, schedule=f"interleaved(chunks = {m})")
    assert got[0] == p * (1 + Fraction(p - 1, p * m))  # estimator.md's factor
    assert got == [Fraction(11, 2), Fraction(9, 2), Fraction(7, 2), Fraction(5, 2)]


def test_interleaved_with_one_chunk_is_1f1b():
    assert flights(pp=2, layers=4, micro_batches=4, schedule="interleaved(chunks = 1)") == [2, 1]


def test_interleaved_in_flight_capped_by_the_micro_batches():
    assert flights(pp=4, layers=16, micro_batches=4, schedule="interleaved(chunks = 2)")[0] == 4


def test_activations_are_per_layer_times_layers_times_in_flight():
    est = estimate_of(
        spec_text(pp=4, layers=16, micro_batches=16, schedule="interleaved(chunks = 2)")
    )
    for s in est.stages:
        assert s.activations_bytes == s.activation_bytes_per_layer * s.layers * (
            s.in_flight_micro_batches
        )


def test_in_flight_function_directly():
    spec = checked(spec_text(pp=2, layers=4, micro_batches=3)).spec
    assert [in_flight(spec, s) for s in (0, 1)] == [2, 1]


# rows of a stage --------------------------------------------------------------


def test_accumulation_buffer_only_with_several_micro_batches():
    one = estimate_of(spec_text()).stages[0]
    many = estimate_of(spec_text(micro_batches=4)).stages[0]
    assert one.accumulation_bytes == 0
    assert many.accumulation_bytes == many.grads_bytes > 0


def test_hccl_two_buffers_per_axis_above_one():
    assert estimate_of(spec_text()).stages[0].hccl_bytes == 0
    est = estimate_of(spec_text(dp=2, tp=2, pp=2, micro_batches=2))
    assert {s.hccl_bytes for s in est.stages} == {3 * 2 * 200 * MiB}


def test_logits_on_the_last_stage_other_activations_where_their_ops_run():
    est = estimate_of(spec_text(dp=2, pp=2, micro_batches=4))
    first, last = est.stages
    b, s, h, v = 2 // 2, 32, 64, 512  # per device: batch split over dp
    assert first.logits_bytes == 0
    assert last.logits_bytes == 5 * b * s * v + 4 * b * s  # exp, mask, row sums; 1 in flight
    assert first.other_activations_bytes == 4 * b * s * 2  # token ids, 2 in flight
    assert last.other_activations_bytes == 2 * (2 * b * s * h)  # norm's and the logits' input


def test_tied_table_on_first_and_last_stage_counted_once_in_total():
    est = estimate_of(spec_text(pp=2, micro_batches=2))
    result = checked(spec_text(pp=2, micro_batches=2))
    plan = Plan(result.spec, result.facts)
    table = 512 * 64
    assert sum(s.params for s in est.stages) == plan.params_total + table


def test_total_headroom_and_fits():
    s = estimate_of(spec_text(budget="1 GiB")).stages[0]
    rows = (
        s.weights_bytes + s.grads_bytes + s.accumulation_bytes + s.optimizer_bytes
        + s.activations_bytes + s.other_activations_bytes + s.logits_bytes
        + s.recompute_working_bytes + s.hccl_bytes
    )  # fmt: skip
    assert s.total_bytes == rows
    assert s.headroom_bytes == -(-rows // 10)
    assert s.fits and s.budget_bytes == GiB


def test_budget_defaults_to_device_memory_minus_reserve():
    assert estimate_of(spec_text(device="ascend910a")).budget_bytes == 29 * GiB
    assert estimate_of(spec_text(device="a100_80g")).budget_bytes == 79 * GiB


def test_sequence_parallel_falls_out_of_the_splits():
    sp = GPT_LAYER.replace("[dp, 1, 1]", "[dp, tp, 1]").replace(
        "d1   = dropout(proj, 0.1)", "d1   = dropout(proj, 0.1) @ [dp, tp, 1]"
    )
    sp = sp.replace("d2   = dropout(down, 0.1)", "d2   = dropout(down, 0.1) @ [dp, tp, 1]")
    t = 4
    plain = estimate_of(spec_text(tp=t)).stages[0].activation_bytes_per_layer
    split = estimate_of(spec_text(tp=t, layer=sp)).stages[0].activation_bytes_per_layer
    s, b, h, a = 32, 1, 64, 4
    sbh = s * b * h
    assert plain == sbh * (10 + 24 // t) + 5 * a * s * s * b // t
    assert split == (34 * sbh + 5 * a * s * s * b) // t


def test_several_layer_kinds_on_a_stage():
    layer2 = "layer mixer {" + GPT_LAYER.replace("dropout = 0.1)", "flash = true)") + "}\n"
    network = GPT_NETWORK.replace(
        "body   = repeat decoder(x) layers",
        "mid    = repeat decoder(x) layers\n    body   = repeat mixer(mid) 2",
    )
    est = estimate_of(spec_text(layers=2, network=network, extra=layer2))
    (stage,) = est.stages
    kinds = {k.layer: k for k in stage.layer_kinds}
    assert stage.layers == 4 and {k.copies for k in kinds.values()} == {2}
    per_micro_batch = sum(k.copies * k.activation_bytes_per_layer for k in kinds.values())
    assert stage.activations_bytes == per_micro_batch
    assert stage.activation_bytes_per_layer == -(-per_micro_batch // 4)


def test_a_million_layers_estimate_like_four():
    est = estimate_of(spec_text(layers=10**6, pp=2, micro_batches=2))
    assert [s.layers for s in est.stages] == [500_000, 500_000]


# published numbers ------------------------------------------------------------

KORTHIKANTI = SPECS / "validation" / "korthikanti22b.msl"
KORTHIKANTI_SP = SPECS / "validation" / "korthikanti22b_sp.msl"
s_, b_, h_, a_, t_, L_ = 2048, 4, 6144, 64, 8, 48
SBH = s_ * b_ * h_


def per_layer(path: Path, overrides=()) -> int:
    (stage,) = estimate_file(path, overrides).stages
    assert stage.layers == L_ and stage.in_flight_micro_batches == 1
    assert stage.activations_bytes == stage.activation_bytes_per_layer * L_
    return stage.activation_bytes_per_layer


def test_korthikanti_tensor_parallel_59_25_gib():
    got = per_layer(KORTHIKANTI)
    assert got * L_ == int(59.25 * GiB)
    assert got == SBH * (10 + 24 // t_) + 5 * a_ * s_ * s_ * b_ // t_


def test_korthikanti_tensor_parallel_selective():
    got = per_layer(KORTHIKANTI, ["recompute.decoder=select(att)"])
    assert got == SBH * (10 + 24 // t_)


def test_korthikanti_full_recompute_keeps_2sbh():
    assert per_layer(KORTHIKANTI, ["recompute.decoder=full"]) == 2 * SBH


def test_korthikanti_sequence_parallel_selective_9_5625_gib():
    got = per_layer(KORTHIKANTI_SP)
    assert got * L_ == int(9.5625 * GiB)
    assert got == 34 * SBH // t_


def test_korthikanti_sequence_parallel_no_recompute():
    got = per_layer(KORTHIKANTI_SP, ["recompute.decoder=none"])
    assert got == SBH // t_ * 34 + 5 * a_ * s_ * s_ * b_ // t_


def test_korthikanti_model_states_are_18_bytes_per_device_param():
    (stage,) = estimate_file(KORTHIKANTI).stages
    states = stage.weights_bytes + stage.grads_bytes + stage.optimizer_bytes
    assert states == 18 * stage.params
    assert 46 * GiB < states < 47 * GiB  # the figure's 45.5625 GiB counts matrices only


def test_korthikanti_is_over_an_a100():
    est = estimate_file(KORTHIKANTI)
    assert not est.fits and est.budget_bytes == 79 * GiB
    assert estimate_file(KORTHIKANTI_SP).fits


# exact parameter counts -------------------------------------------------------


def test_gpt7b_params_total():
    v, h, s, n = 50304, 4096, 2048, 32
    layer = (
        2 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (4 * h * h + 4 * h) + (4 * h * h + h)
    )
    expected = n * layer + v * h + s * h + 2 * h  # tied output layer: the table once
    assert expected == 6_658_596_864
    assert estimate_file(SPECS / "gpt7b.msl").params_total == expected


def test_llama13b_params_total():
    llama = SPECS / "llama13b.msl"  # a missing spec fails here: never a skip
    v, h, f, n, heads, kv, hd = 32000, 5120, 13824, 40, 40, 40, 128
    layer = h + h * (heads + 2 * kv) * hd + heads * hd * h + h + 3 * h * f  # no biases
    expected = n * layer + v * h + h + h * v  # untied output layer
    assert expected == 13_015_864_320  # LLaMA-2-13B as published (Touvron et al. 2023)
    assert estimate_file(llama).params_total == expected


def test_gpt1t_params_total_and_per_device_split():
    v, h, s, n = 51200, 25600, 2048, 128
    layer = 12 * h * h + 13 * h
    est = estimate_file(SPECS / "validation" / "gpt1t_4096.msl")
    assert est.params_total == n * layer + v * h + s * h + 2 * h
    assert est.devices == 4096 and est.fits
    middle = est.stages[1]
    tp = 8
    per_layer = (12 * h * h) // tp + 3 * h // tp + 4 * h // tp + h + h + 4 * h
    assert middle.params == 2 * per_layer


def test_stage_params_use_each_params_own_split():
    est = estimate_file(SPECS / "gpt7b.msl")
    h, v, s, n, t = 4096, 50304, 2048, 32, 2
    whole = 2 * h + 2 * h + h + h  # norms and row-parallel biases stay whole
    split = (12 * h * h + 3 * h + 4 * h) // t
    assert est.stages[0].params == n * (whole + split) + v * h // t + s * h + 2 * h
