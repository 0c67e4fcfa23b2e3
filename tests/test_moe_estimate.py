"""The memory and time model's MoE rows against hand derivations, on
tests/specs/tiny_moe.msl widened to hidden = ffn = shared_ffn = 256 (so expert slices
pass hsdp's 64 KiB threshold), dp 4, tp 2, ep 2, zero 1, fp32: micro_batch 1 x dp 4
sequences of 32 = T 128 tokens per micro-batch, 32 per device; top_k 2, 4 experts."""

from __future__ import annotations

from math import ceil
from pathlib import Path

import pytest

from msgen.analysis.facts import context
from msgen.analysis.plan import Plan
from msgen.compiler import analyze_text
from msgen.estimate.activations import saved_bytes
from msgen.estimate.flops import op_work
from msgen.estimate.memory import estimate, param_states, precision
from msgen.estimate.op_time import Machine, group_bytes
from msgen.estimate.time import step_time
from msgen.ir.devices import DEVICES
from msgen.ir.mesh import RankMesh

SPEC = Path(__file__).resolve().parent / "specs" / "tiny_moe.msl"


def analysed(
    moe_args: str = "", ep: int = 2, zero: int = 1, recompute: str = "none", experts: int = 4
):
    text = SPEC.read_text().replace("experts = 4", f"experts = {experts}")
    text = text.replace("hidden   = 64", "hidden   = 256").replace("ffn      = 32", "ffn = 256")
    text = text.replace("aux_loss = 0.01", moe_args + "aux_loss = 0.01")
    text = text.replace("    tp = 2\n}", f"    tp = 2\n    ep = {ep}\n}}")
    text = text.replace("    seed         = 1234", f"    seed         = 1234\n    zero = {zero}")
    text = text.replace("train {", f"recompute {{\n    decoder = {recompute}\n}}\n\ntrain {{")
    result = analyze_text(text, "moe.msl", SPEC.parent)
    assert result.ok, [d.message for d in result.diagnostics if d.is_error]
    return result


def sizes(result):
    m = result.spec.mesh
    return {"dp": m.dp, "tp": m.tp, "pp": m.pp, "ep": m.ep}


def moe_facts(result):
    return result.facts.graphs["decoder"].ops["ffn2"]


# Per device, derived in the docstring below: the router, 3 stacked expert matrices and
# 3 shared expert matrices.
EXPERT_STATES = {
    "params": 1024 + 3 * 65536 + 3 * 32768,
    "weights": 4 * (1024 + 3 * (65536 + 32768) + 3 * (32768 + 8192)),
    "grads": 4 * (1024 + 3 * 32768 + 3 * 8192),
    "optimizer": 8 * (1024 + 3 * 32768 + 3 * 8192),
}


@pytest.mark.parametrize("term", sorted(EXPERT_STATES))
def test_expert_states_are_split_over_ep_and_zero_slices_them_over_dp_over_ep(term):
    """Per device (Megatron-LM's theoretical memory divides expert parameters by ep,
    and its distributed optimizer shards expert states over the expert data-parallel
    group, dp / ep), with a capacity (capacity = 1):
    - gate, up [4, 256, 256] @ [ep, 1, tp] and down [4, 256, 256] @ [ep, tp, 1]:
      2 x 256 x 128 = 65,536 elements each, 256 KiB >= 64 KiB; zero 1 slices their
      first dim (2) over dp / ep = 2: Adam states of 32,768 each. (Over dp = 4 the
      first dim 2 would not divide, and they would stay whole.)
    - router [256, 4], whole: 1,024 elements, under the threshold: whole.
    - shared gate, up [256, 256] @ [1, tp]: 256 x 128 = 32,768, first dim 256 over
      dp = 4: 8,192; shared down @ [tp, 1]: 128 x 256, 128 / 4: 8,192.
    At zero 1 (hsdp level 1) a sliced weight is stored as its slice plus the whole
    weight its forward AllGather keeps until backward, and its gradient as the slice
    (the AllGather's backward is a ReduceScatter): 4 bytes each; Adam m + v 8 bytes
    per element of the slice."""
    result = analysed("capacity = 1.0, ")
    states = param_states(
        list(moe_facts(result).params), sizes(result), precision(result.spec), zero=1
    )
    assert getattr(states, term) == EXPERT_STATES[term]


def test_dropless_experts_are_whole_over_tp():
    """Dropless, the generated Morph region keeps each expert whole over tp (its
    layout (ep, None, None), templates/ops/moe_permute.py.j2 `region`, as mindformers 2.0.0's
    grouped-matmul path lays its weights): gate, up, down [4, 256, 256] @ [ep, 1, 1]:
    2 x 256 x 256 = 131,072 elements a device each (twice the capacity path's). The
    devices of the stage holding the same 2 experts are dp / ep x tp = 4, which 2 does
    not divide: zero 1 leaves them whole (tensor_layout.cc, GenerateOptShardSliceShape:
    the first dim over its split times the repeated devices), no gathered copy. The
    router and the shared experts as with a capacity."""
    result = analysed()
    params = {p.name: p for p in moe_facts(result).params}
    assert all(params[m].split == (("ep",), (), ()) for m in ("gate", "up", "down"))
    states = param_states(list(params.values()), sizes(result), precision(result.spec), zero=1)
    assert states.params == 1024 + 3 * 131072 + 3 * 32768
    assert states.weights == 4 * (1024 + 3 * 131072 + 3 * (32768 + 8192))
    assert states.grads == 4 * (1024 + 3 * 131072 + 3 * 8192)
    assert states.optimizer == 8 * (1024 + 3 * 131072 + 3 * 8192)


def test_zero_splits_a_parameter_over_every_device_of_its_stage_holding_its_slice():
    """The parallel optimizer's group is every device of the stage that holds the same
    slice (operator_info.cc, CreateGroupForOptShard; hsdp's shard_size -1 is "the data
    parallel group of each parameter": msgen/analysis/optimizer_shard.py), not dp
    alone. By hand at dp 4, tp 2, ep 2, zero 1, fp32 (Adam's m and v 8 bytes an
    element), 8 experts, dropless:
    - emb.table [256, 256], not split: every one of the stage's dp x tp = 8 devices
      holds it whole; 256 KiB >= hsdp's 64 KiB, and 256 rows / 8 = 32: each device
      keeps 256 x 256 / 8 = 8,192 elements of Adam state, 65,536 bytes (a dp-only
      split would keep 16,384 elements, 131,072 bytes).
    - decoder.*.ffn2.gate [8, 256, 256] @ [ep, 1, 1] (dropless, whole over tp): a
      device holds its ep index's 4 experts, 4 x 256 x 256 = 262,144 elements; the
      devices holding the same 4 are dp / ep x tp = 2 x 2 = 4 (ranks 0, 1, 4, 5 for
      rank 0); 4 experts / 4 = 1 a device: 65,536 elements, 524,288 bytes of Adam
      state (over dp / ep = 2 alone: 1,048,576)."""
    result = analysed(experts=8)
    plan = Plan(result.spec, result.facts)
    prec = precision(result.spec)
    emb = next(p for op, p in plan.network_params() if op == "emb")
    gate = next(p for op, p in plan.layer_params("decoder") if op == "ffn2" and p.name == "gate")
    assert (emb.shape, gate.shape, gate.split) == ((256, 256), (8, 256, 256), (("ep",), (), ()))
    assert param_states([emb], sizes(result), prec, zero=1).optimizer == 65536
    assert param_states([gate], sizes(result), prec, zero=1).optimizer == 524288


# What the moe op keeps for backward, per device and micro-batch, in bytes, by hand:
# fp32 (4 bytes); the device's 32 tokens (128 over dp 4, x whole over tp) and their 64
# routed copies (top_k 2; with ep 2 a device's experts receive the copies of its ep
# group, 2 x 64, for 2 of the 4 experts: 64 again), of which each tp rank takes its own
# half into the dropless Morph region: 32; hidden 256; the dropless experts whole over
# tp (ffn 256), the shared experts' shared_ffn 256 over tp 2.
ACTIVATION_ROWS = {
    # the input, read by the router's and the shared experts' weight gradients
    "n2": 4 * 32 * 256,
    # the router's fp32 probabilities [tokens, experts]: softmax's backward reads them
    "ffn2.probs": 4 * 32 * 4,
    # the top-k weights (fp32) and expert indices (int32) [tokens, top_k]
    "ffn2.topk_weights": 4 * 32 * 2,
    "ffn2.topk_indices": 4 * 32 * 2,
    # the permute buffer: the token copies the experts' first matmuls read
    "ffn2.permuted": 4 * 32 * 256,
    # swiglu's two halves and its product [copies / tp, ffn]: down's input and silu's
    "ffn2.gate": 4 * 32 * 256,
    "ffn2.up": 4 * 32 * 256,
    "ffn2.act": 4 * 32 * 256,
    # the un-permute buffer: the experts' outputs [copies, hidden] the weighted sum reads
    "ffn2.expert_out": 4 * 32 * 256,
    # the shared expert over every token: its halves and product [tokens, shared / tp]
    "ffn2.shared_gate": 4 * 32 * 128,
    "ffn2.shared_up": 4 * 32 * 128,
    "ffn2.shared_act": 4 * 32 * 128,
}


def test_the_moe_op_saves_exactly_the_activation_rows_derived_by_hand():
    result = analysed()
    assert [s.key for s in moe_facts(result).saves] == list(ACTIVATION_ROWS)


@pytest.mark.parametrize("key", sorted(ACTIVATION_ROWS))
def test_each_moe_activation_row_per_device_by_hand(key):
    """One row of ACTIVATION_ROWS (its derivation beside it there)."""
    result = analysed()
    (saved,) = [s for s in moe_facts(result).saves if s.key == key]
    assert saved_bytes(saved, sizes(result)) == ACTIVATION_ROWS[key]


def test_capacity_pads_every_expert_and_imbalance_scales_the_dropless_copies():
    """capacity 0.5: in each of the dp 4 groups of 32 tokens each of 4 experts gets
    ceil(32 x 2 / 4 x 0.5) = 8 slots, 4 x 4 x 8 = 128 rows in all, 32 per device
    (the experts' ffn over tp: gate, up, act 32 x 128), and the dispatch and combine
    tensors [32 rows, 32 group tokens] per device; imbalance 1.5 dropless: ceil(256 x
    1.5) = 384 rows, 48 per device (over dp and tp), the experts whole."""
    fixed = 4 * (32 * 256 + 32 * 4 + 2 * 32 * 2 + 3 * 32 * 128)
    dispatch = 2 * 4 * 32 * 32
    padded = ("capacity = 0.5, ", 32 * 4 * (2 * 256 + 3 * 128), dispatch)
    imbalanced = ("imbalance = 1.5, ", 48 * 4 * (2 * 256 + 3 * 256), 0)
    for args, rows, extra in (padded, imbalanced):
        result = analysed(args)
        got = sum(saved_bytes(s, sizes(result)) for s in moe_facts(result).saves)
        assert got == fixed + rows + extra, args


def test_a_capacity_above_experts_over_top_k_pads_no_expert_beyond_its_groups_tokens():
    """capacity 4 >= experts / top_k = 2: Megatron-LM's get_capacity gives each expert
    ceil(32 x 2 / 4 x 4) = 64 slots in a group of 32 tokens, but top-k picks distinct
    experts, so at most every one of the 32 tokens reaches an expert: 32 slots, the
    generated cell's `MoE.slots` (min(group, wanted)). In each of the dp 4 groups the
    4 experts get 32 slots: 4 x 4 x 32 = 512 rows, 128 per device (permuted and
    expert_out 128 x 256, gate, up, act 128 x 128 over tp), the dispatch and combine
    tensors [128 rows, 32 group tokens] per device; the dispatch all-to-all moves the
    512 rows of hidden 256. Uncapped it would be 1,024 rows and twice each."""
    result = analysed("capacity = 4.0, ")
    of = moe_facts(result)
    fixed = 4 * (32 * 256 + 32 * 4 + 2 * 32 * 2 + 3 * 32 * 128)
    rows = 128 * 4 * (2 * 256 + 3 * 128)
    dispatch = 2 * 4 * 128 * 32
    assert sum(saved_bytes(s, sizes(result)) for s in of.saves) == fixed + rows + dispatch
    (moved,) = [c for c in of.layout.collectives if c.what == "dispatch"]
    assert moved.elements == 512 * 256


def test_all_to_all_time_by_hand():
    """Dispatch moves the T k = 256 copies of 256 fp32 values; with a capacity of 1
    (the padded slots are the copies' number: 4 groups x 4 experts x ceil(32 x 2 / 4
    x 1) = 16 slots = 256 rows) an ep group holds ep of the dp shards, so it
    exchanges 256 x 256 x 4 x 2 / 4 = 131,072 bytes; each of its 2 ranks sends half
    of its 65,536 to the other: (n - 1) / n x 65,536 bytes over the intra-server link
    (ranks 0 and 2: tp-strided), plus one latency step. Dropless each tp rank
    exchanges its own tokens' copies: half that per group."""
    dropless = analysed()
    of = moe_facts(dropless)
    dispatch = next(c for c in of.layout.collectives if c.what == "dispatch")
    assert group_bytes(dispatch, of.layout, RankMesh.of(dropless.spec), 4) == 65536
    result = analysed("capacity = 1.0, ")
    of = moe_facts(result)
    dispatch = next(c for c in of.layout.collectives if c.what == "dispatch")
    assert dispatch.kind == "AllToAll" and dispatch.axes == ("ep",)
    device = DEVICES["ascend910b"]
    machine = Machine(device, device.matmul_flops["fp32"], RankMesh.of(result.spec), sizes(result))
    gb = group_bytes(dispatch, of.layout, machine.mesh, 4)
    assert gb == 131072
    link = device.intra
    want = 0.5 * 65536 / link.bus_bandwidth(2) + link.latency
    assert abs(machine.axes_time(dispatch, gb) - want) < 1e-15


def test_ep_adds_its_communicator_buffers_and_no_devices():
    """HCCL gives each communicator two buffers of HCCL_BUFFSIZE, 200 MiB by default
    (Ascend's HCCL environment variables); the all-to-alls run on the ep group's own
    communicator, so ep > 1 adds 2 x 200 MiB per device. ep is carved out of dp: the
    devices stay dp x tp x pp = 4 x 2 x 1 = 8."""
    with_ep, without = analysed(), analysed(ep=1)
    est = estimate(Plan(with_ep.spec, with_ep.facts))
    one = estimate(Plan(without.spec, without.facts))
    assert est.devices == one.devices == 8
    assert est.stages[0].hccl_bytes - one.stages[0].hccl_bytes == 2 * 200 * 2**20


@pytest.mark.parametrize("recompute, exchanges", [("none", 4), ("full", 6)])
def test_the_step_pays_every_all_to_all_of_every_moe_layer_and_micro_batch(recompute, exchanges):
    """The step's tensor-parallel communication (hidden and not: the column the
    all-to-all counts in), ep 2 against ep 1 on the same spec: only the moe op's
    all-to-alls differ (its tp all-reduces and every other op's do not depend on ep;
    the experts' gradient reduction over dp / ep is dp communication), with a capacity
    of 1 as in test_all_to_all_time_by_hand. Per moe layer
    and micro-batch: dispatch and combine forward, and their two backward; a recomputed
    layer reruns its forward's two. Each by hand as in test_all_to_all_time_by_hand:
    each of the 2 ranks sends half of its 65,536 bytes to the other over one intra-server
    link, plus one latency step. 2 micro-batches x 2 layers x `exchanges`."""
    link = DEVICES["ascend910b"].intra
    one = 0.5 * 65536 / (link.bandwidth * link.efficiency) + link.latency

    def tp_comm(ep: int) -> float:
        result = analysed("capacity = 1.0, ", ep=ep, recompute=recompute)
        plan = Plan(result.spec, result.facts)
        (stage,) = step_time(plan, estimate(plan)).stages
        return stage.tp_comm_s + stage.tp_comm_hidden_s

    got = tp_comm(2) - tp_comm(1)
    assert abs(got - 2 * 2 * exchanges * one) < 1e-12 * got


# One exchange, by hand as in test_all_to_all_time_by_hand: the T k = 256 token copies of
# 256 fp32 values, 262,144 bytes, are the dp 4 ranks'; an ep group holds 2 of them,
# 131,072 bytes, 65,536 a rank (a capacity of 1 pads to the same 256 rows); dropless each
# tp rank exchanges only its own tokens' copies, 32,768. Each of the group's 2 ranks
# sends half of its share to the other (ranks 0 and 2, tp-strided: one HCCS link of
# 56 GB/s x 0.33 inside the server), plus one latency step of 10 us.
HCCS = 56e9 * 0.33
ONE_EXCHANGE = {"capacity = 1.0, ": 0.5 * 65536 / HCCS + 10e-6, "": 0.5 * 32768 / HCCS + 10e-6}


@pytest.mark.parametrize("moe_args", sorted(ONE_EXCHANGE))
@pytest.mark.parametrize("recompute, exchanges", [("none", 4), ("full", 6)])
def test_the_step_pays_the_all_to_alls_exposed(moe_args, recompute, exchanges):
    """Nothing hides an all-to-all: the experts' matmuls wait for the dispatch and the
    next op for the combine, backward alike (the combine's backward before any
    expert's, the dispatch's before the input gradient leaves), and the generated
    code overlaps them with nothing, as Megatron-LM without
    `moe_shared_expert_overlap` or its 1F1B all-to-all overlap. So the device's
    tp_overlap share (0.515 on the 910B, fitted on fused matmul collectives) leaves
    them alone: ep 2 against ep 1 on the same spec adds the all-to-alls' time, all of
    it, to the unhidden tp communication column and nothing to the hidden one, the
    compute staying equal. 2 micro-batches x 2 moe layers x `exchanges` (dispatch
    and combine forward, their two backward, and a recomputed layer's forward two
    again) x ONE_EXCHANGE. The step grows by that plus what ep changes after the
    micro-batches: the gradient reduction and the optimizer over fewer expert
    parameters per device (one stage: no bubble, no idle)."""
    want = 2 * 2 * exchanges * ONE_EXCHANGE[moe_args]

    def stage(ep: int):
        result = analysed(moe_args, ep=ep, recompute=recompute)
        plan = Plan(result.spec, result.facts)
        time = step_time(plan, estimate(plan))
        (only,) = time.stages
        return time.step_s, only

    (step2, two), (step1, one) = stage(2), stage(1)
    assert two.compute_s == one.compute_s
    assert abs(two.tp_comm_hidden_s - one.tp_comm_hidden_s) < 1e-9 * want
    assert abs(two.tp_comm_s - one.tp_comm_s - want) < 1e-9 * want
    after = two.dp_comm_s + two.optimizer_s - one.dp_comm_s - one.optimizer_s
    assert abs(step2 - step1 - after - want) < 1e-9 * want


@pytest.mark.parametrize("imbalance", [1.0, 1.5])
def test_imbalance_scales_the_busiest_ranks_all_to_all_and_expert_kernels(imbalance):
    """The time model's load-imbalance input, dropless: the busiest expert rank receives
    `imbalance` times the mean token copies, T k = 128 x 2 = 256. Its all-to-alls move
    ceil(256 x imbalance) copies of hidden 256 (dispatch and combine alike), and its
    expert kernels compute over them: router 2 T h E + experts 3 x 2 x (256 x imbalance)
    x h F + shared expert 3 x 2 T h S, with h = F = S = 256, E = 4. Model FLOPs count
    the routed copies only, whatever the imbalance."""
    result = analysed(f"imbalance = {imbalance}, ")
    of = moe_facts(result)
    t, h, e, k, f, s = 128, 256, 4, 2, 256, 256
    copies = t * k * imbalance
    for what in ("dispatch", "combine"):
        (c,) = [c for c in of.layout.collectives if c.what == what]
        assert c.elements == ceil(copies) * h, what
    work = op_work(of, context(result.spec))
    shared = 3 * 2 * t * h * s
    assert work.kernel_flops == 2 * t * h * e + 3 * 2 * copies * h * f + shared
    assert work.matmul_flops == 2 * t * h * e + 3 * 2 * t * k * h * f + shared


# 910B inside a server: HCCS, a full mesh, n - 1 links of 56 GB/s x 0.33 for a group of
# n, 10 us a ring step; across servers: RoCE, 25 GB/s x 0.8, 15 us a step.
HCCS_LINK, ROCE_LINK = 56e9 * 0.33, 25e9 * 0.8
EXPERT_REDUCTION = {
    # capacity (ffn over tp): the 2 ranks holding rank 0's experts are 0 and 4, dp / ep
    # of them; 2 layers x 2 x 256 x 128 fp32 = 524,288 bytes, a ring all-reduce of 2
    # steps, each 1/2 of the bytes
    ("capacity = 1.0, ", 8): 2 / 2 * 524288 / HCCS_LINK + 2 * 10e-6,
    ("capacity = 1.0, ", 4): 2 / 2 * 524288 / ROCE_LINK + 2 * 15e-6,
    # dropless (whole over tp): ranks 0, 1, 4, 5, dp / ep x tp; 2 x 2 x 256 x 256 fp32 =
    # 1,048,576 bytes, 6 steps of 1/4, on 3 links inside a server
    ("", 8): 6 / 4 * 1048576 / (3 * HCCS_LINK) + 6 * 10e-6,
    ("", 4): 6 / 4 * 1048576 / ROCE_LINK + 6 * 15e-6,
}


@pytest.mark.parametrize("moe_args, per_node", sorted(EXPERT_REDUCTION))
def test_the_experts_gradients_are_reduced_over_the_ranks_holding_them(moe_args, per_node):
    """The gate weights' gradient reduction (zero 0: the mirror's all-reduce), by hand
    (EXPERT_REDUCTION): over the ranks of the stage holding the same experts, not over
    all dp = 4 of them, on the link that group spans as the mesh lays the ranks (tp
    innermost, then ep: rank 4 is on the second server of 4 devices)."""
    from msgen.estimate.update_time import dp_comm

    result = analysed(moe_args, zero=0)
    gate = next(p for p in moe_facts(result).params if p.name == "gate")
    device = DEVICES["ascend910b"]
    mesh = RankMesh(dp=4, tp=2, ep=2, per_node=per_node)
    machine = Machine(device, device.matmul_flops["fp32"], mesh, sizes(result))
    reduce, gathers = dp_comm([(gate, 2)], precision(result.spec), 0, 2, machine)
    want = EXPERT_REDUCTION[moe_args, per_node]
    assert gathers == 0 and abs(reduce - want) < 1e-9 * want
