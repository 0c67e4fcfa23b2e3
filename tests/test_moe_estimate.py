"""The memory and time model's MoE rows against hand derivations, on
tests/specs/tiny_moe.msl widened to hidden = ffn = shared_ffn = 256 (so expert slices
pass hsdp's 64 KiB threshold), dp 4, tp 2, ep 2, zero 1, fp32: micro_batch 1 x dp 4
sequences of 32 = T 128 tokens per micro-batch, 32 per device; top_k 2, 4 experts."""

from __future__ import annotations

from pathlib import Path

from msgen.analysis.plan import Plan
from msgen.compiler import analyze_text
from msgen.estimate.memory import estimate, param_states, precision, saved_bytes
from msgen.estimate.time import Machine, group_bytes
from msgen.ir.devices import DEVICES

SPEC = Path(__file__).resolve().parent / "specs" / "tiny_moe.msl"


def analysed(moe_args: str = "", ep: int = 2, zero: int = 1):
    text = SPEC.read_text()
    text = text.replace("hidden   = 64", "hidden   = 256").replace("ffn      = 32", "ffn = 256")
    text = text.replace("aux_loss = 0.01", moe_args + "aux_loss = 0.01")
    text = text.replace("    tp = 2\n}", f"    tp = 2\n    ep = {ep}\n}}")
    text = text.replace("    seed         = 1234", f"    seed         = 1234\n    zero = {zero}")
    result = analyze_text(text, "moe.msl", SPEC.parent)
    assert result.ok, [d.message for d in result.diagnostics if d.is_error]
    return result


def sizes(result):
    m = result.spec.mesh
    return {"dp": m.dp, "tp": m.tp, "pp": m.pp, "ep": m.ep}


def moe_facts(result):
    return result.facts.graphs["decoder"].ops["ffn2"]


def test_expert_states_are_split_over_ep_and_zero_slices_them_over_dp_over_ep():
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
    n = 1024 + 3 * 65536 + 3 * 32768
    assert states.params == n
    assert states.weights == 4 * (1024 + 3 * (65536 + 32768) + 3 * (32768 + 8192))
    assert states.grads == 4 * (1024 + 3 * 32768 + 3 * 8192)
    assert states.optimizer == 8 * (1024 + 3 * 32768 + 3 * 8192)


def test_dropless_experts_are_whole_over_tp():
    """Dropless, the generated Morph region keeps each expert whole over tp (its
    layout (ep, None, None), templates/ops/moe_permute.py.j2 `region`, as mindformers 2.0.0's
    grouped-matmul path lays its weights): gate, up, down [4, 256, 256] @ [ep, 1, 1]:
    2 x 256 x 256 = 131,072 elements a device each (twice the capacity path's), zero 1
    slicing their first dim 2 over dp / ep = 2: 65,536. The router and the shared
    experts as with a capacity."""
    result = analysed()
    params = {p.name: p for p in moe_facts(result).params}
    assert all(params[m].split == (("ep",), (), ()) for m in ("gate", "up", "down"))
    states = param_states(list(params.values()), sizes(result), precision(result.spec), zero=1)
    assert states.params == 1024 + 3 * 131072 + 3 * 32768
    assert states.weights == 4 * (1024 + 3 * (131072 + 65536) + 3 * (32768 + 8192))
    assert states.grads == 4 * (1024 + 3 * 65536 + 3 * 8192)
    assert states.optimizer == 8 * (1024 + 3 * 65536 + 3 * 8192)


def test_moe_activation_rows_per_device():
    """Per device and micro-batch, fp32 (4 bytes), 32 tokens (x whole over tp): x 32 x
    256; router probs 32 x 4; top-k weights and int32 indices 32 x 2 each; dropless,
    each tp rank takes its own half of the 64 token copies into the Morph region:
    permuted copies and expert outputs 32 x 256 each, gate, up, act 32 x 256 (the
    experts whole); the shared expert's gate, up, act 32 x (256 / tp)."""
    result = analysed()
    got = sum(saved_bytes(s, sizes(result)) for s in moe_facts(result).saves)
    want = 4 * (32 * 256 + 32 * 4 + 2 * 32 * 2 + 2 * 32 * 256 + 3 * 32 * 256 + 3 * 32 * 128)
    assert got == want


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
    assert group_bytes(dispatch, of.layout, sizes(dropless), 4) == 65536
    result = analysed("capacity = 1.0, ")
    of = moe_facts(result)
    dispatch = next(c for c in of.layout.collectives if c.what == "dispatch")
    assert dispatch.kind == "AllToAll" and dispatch.axes == ("ep",)
    device = DEVICES["ascend910b"]
    machine = Machine(device, device.matmul_flops["fp32"], 8, sizes(result))
    gb = group_bytes(dispatch, of.layout, sizes(result), 4)
    assert gb == 131072
    link = device.intra
    want = 0.5 * 65536 / link.bus_bandwidth(2) + link.latency
    assert abs(machine.axes_time(dispatch, gb) - want) < 1e-15


def test_ep_adds_its_communicator_buffers_and_no_devices():
    with_ep, without = analysed(), analysed(ep=1)
    est = estimate(Plan(with_ep.spec, with_ep.facts))
    one = estimate(Plan(without.spec, without.facts))
    assert est.devices == one.devices == 8
    assert est.stages[0].hccl_bytes - one.stages[0].hccl_bytes == 2 * 200 * 2**20
