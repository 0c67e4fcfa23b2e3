"""Where a step of micro-batches reads each parameter's gradient under semi-auto parallel.

The rule, from MindSpore's source (msgen/analysis/gradients.py cites it): the parallel
pass inserts a mirror for a parameter only when another device of its stage holds the
same slice; each micro-batch's gradient is added into the parameter's `accu_grads`
buffer, and with the parallel optimizer on (zero > 0) the mirror returns the reduced
sum as the gradient. So with zero > 0 a replicated parameter's gradient is the one its
mirror returns ("mirror"), and a parameter split over every device of its stage has
no mirror, receives 0 and keeps its gradient in the buffer ("accu_grads"); with zero
= 0 every gradient is in the buffer.

The oracles are hand tables, one line of reasoning per parameter:

tests/specs/tiny_moe_dp.msl with ep = 2 and zero = 1 (dp 2, tp 1: 2 devices a stage).
The stacked experts gate, up, down ([4, ...], experts over ep = 2) give each device
2 experts of its own: 2 / 2 = 1 device per slice, no mirror, "accu_grads". Everything
else (embedding, norms, q/k norms, attention and output weights, the router, the
shared expert) is whole on both devices: 2 copies, "mirror".

specs/tiny_llama.msl at dp 1, tp 2, pp 2, zero 1 (2 devices a stage). Split over tp:
emb.table [tp, 1], qkv, gate, up [1, tp], o, down [tp, 1], logits.weight [1, tp]: one
device per slice, "accu_grads". The rmsnorm gammas are whole: 2 copies, "mirror".

The rehearsal (`train.py --rehearse`), whose stand-in for the pass returns each
parameter's gradient or 0 as GRADIENT_FROM says, trains step by step as `--standalone`
only if the reducer reads every gradient where that stand-in leaves it
(tests/test_rehearsal.py's oracle); its `rehearsal.json` records where the reducer
read each one.
"""

from __future__ import annotations

import ast
import json
from fnmatch import fnmatch
from pathlib import Path

import pytest

from tests.emit_fixtures import SPECS, compile_spec
from tests.test_rehearsal import (
    STEPS,
    assert_rehearsal_is_standalone,
    rehearsal_json,
    rehearse_and_standalone,
)

M, A = "mirror", "accu_grads"

MOE_EP_OVER_DP = {
    "emb.table": M,
    "decoder.*.n1.gamma": M,
    "decoder.*.qkv.weight": M,
    "decoder.*.att.q_norm": M,
    "decoder.*.att.k_norm": M,
    "decoder.*.o.weight": M,
    "decoder.*.n2.gamma": M,
    "decoder.*.ffn2.router": M,
    "decoder.*.ffn2.gate": A,
    "decoder.*.ffn2.up": A,
    "decoder.*.ffn2.down": A,
    "decoder.*.ffn2.shared_gate": M,
    "decoder.*.ffn2.shared_up": M,
    "decoder.*.ffn2.shared_down": M,
    "norm.gamma": M,
    "logits.weight": M,
}
LLAMA_TP_ONLY = {
    "emb.table": A,
    "decoder.*.n1.gamma": M,
    "decoder.*.qkv.weight": A,
    "decoder.*.o.weight": A,
    "decoder.*.n2.gamma": M,
    "decoder.*.gate.weight": A,
    "decoder.*.up.weight": A,
    "decoder.*.down.weight": A,
    "norm.gamma": M,
    "logits.weight": A,
}


def moe_spec(folder: Path, zero: int) -> Path:
    """tiny_moe_dp with its 4 experts split over ep = 2 = dp."""
    text = SPECS["tiny_moe_dp"].read_text()
    text = text.replace("    tp = 1\n}", "    tp = 1\n    ep = 2\n}")
    text = text.replace(
        "    seed         = 1234",
        f"    seed         = 1234\n    zero = {zero}\n    checkpoint = every 1 keep {STEPS}",
    )
    spec = folder / "tiny_moe_dp.msl"
    spec.write_text(text)
    return spec


def llama_spec(folder: Path, zero: int) -> Path:
    """tiny_llama at dp 1 (4 devices: tp 2 x pp 2), a step of 4 micro-batches of one
    sequence; no rank table (its hccn.conf lists 8 devices)."""
    text = SPECS["tiny_llama"].read_text()
    for old, new in (
        ("    dp = 2\n", "    dp = 1\n"),
        ("per_node   = 8", "per_node   = 4"),
        ('    device_ips = hccn("hccn.conf")   # the file beside this spec\n', ""),
        ("global_batch = 8 ", "global_batch = 4 "),
        ("zero         = 1", f"zero         = {zero}"),
        ("checkpoint   = every 20 keep 2", f"checkpoint   = every 1 keep {STEPS}"),
    ):
        assert old in text, old
        text = text.replace(old, new)
    spec = folder / "tiny_llama.msl"
    spec.write_text(text)
    return spec


CASES = {"moe_ep_over_dp": (moe_spec, MOE_EP_OVER_DP), "llama_tp_only": (llama_spec, LLAMA_TP_ONLY)}


def gradient_from(folder: Path) -> dict[str, str]:
    """train.py's GRADIENT_FROM, read as data."""
    module = ast.parse((folder / "train.py").read_text())
    (table,) = [
        node.value
        for node in module.body
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "GRADIENT_FROM"
    ]
    return ast.literal_eval(table)


def listed(folder: Path) -> dict[str, str]:
    """plan.json's `gradient_from` of each parameter, a repeated layer's under its
    path pattern (each of its runs must say the same)."""
    doc = json.loads((folder / "plan.json").read_text())
    out = {p["path"]: p["gradient_from"] for p in doc["params"] if "gradient_from" in p}
    for run in doc["layer_params"]:
        if "gradient_from" in run:
            pattern = f"{run['layer']}.*.{run['name']}"
            assert out.setdefault(pattern, run["gradient_from"]) == run["gradient_from"]
    return out


@pytest.mark.parametrize("zero", [1, 0])
@pytest.mark.parametrize("case", CASES)
def test_the_table_is_the_hand_derived_one(case, zero, tmp_path):
    """With zero = 1 the hand table; with zero = 0 (no parallel optimizer: the mirror
    writes the reduced sum back into the buffer and returns 1.0) every parameter reads
    its buffer. plan.json lists the same source on each parameter."""
    make, table = CASES[case]
    folder = compile_spec(make(tmp_path, zero), tmp_path / "out")
    expected = table if zero else dict.fromkeys(table, A)
    assert gradient_from(folder) == expected
    assert listed(folder) == expected


def test_a_step_that_reads_no_buffer_lists_no_source(tmp_path):
    """tests/specs/tiny_dp.msl runs in data-parallel mode (only the batch split): the
    backward pass returns each gradient, no mirror or `accu_grads` is read, so plan.json
    names no source and train.py has no GRADIENT_FROM."""
    folder = compile_spec(SPECS["tiny_dp"], tmp_path / "out")
    doc = json.loads((folder / "plan.json").read_text())
    assert doc["params"] and doc["layer_params"]
    assert not listed(folder)
    assert "GRADIENT_FROM" not in (folder / "train.py").read_text()


@pytest.mark.parametrize(
    ("capacity", "experts_from"), [("", M), ("capacity = 1.0, ", A)], ids=["dropless", "capacity"]
)
def test_experts_over_all_of_dp_with_tp(capacity, experts_from, tmp_path):
    """tests/specs/tiny_moe.msl (dp 4, tp 2: 8 devices a stage) with ep = 4 = dp and
    zero = 1. Dropless, each expert is whole over tp (experts over ep only): the 2 tp
    ranks of an ep rank hold the same 1 expert, a mirror, "mirror". With a capacity the
    experts' ffn dim is split over tp too: 4 x 2 = 8 slices, one device each,
    "accu_grads". The router stays whole (8 copies), the shared expert is split over tp
    only (4 copies), the norms are whole: "mirror"."""
    text = SPECS["tiny_moe"].read_text()
    text = text.replace("    tp = 2\n}", "    tp = 2\n    ep = 4\n}")
    text = text.replace("shared_ffn = ffn, ", f"shared_ffn = ffn, {capacity}")
    text = text.replace("    seed         = 1234", "    seed         = 1234\n    zero = 1")
    (tmp_path / "tiny_moe.msl").write_text(text)
    table = gradient_from(compile_spec(tmp_path / "tiny_moe.msl", tmp_path / "out"))
    experts = {f"decoder.*.ffn2.{name}" for name in ("gate", "up", "down")}
    assert {p: s for p, s in table.items() if p in experts} == dict.fromkeys(experts, experts_from)
    whole_or_tp = ("router", "shared_gate", "shared_up", "shared_down")
    rest = {f"decoder.*.ffn2.{name}" for name in whole_or_tp} | {"decoder.*.n1.gamma"}
    assert {p: s for p, s in table.items() if p in rest} == dict.fromkeys(rest, M)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_a_rehearsal_reads_each_gradient_where_the_pass_leaves_it(case, tmp_path):
    """The tiny specs with zero = 1 rehearse as they train stand-alone, and the
    rehearsal's record names every parameter's source as the hand table does."""
    make, table = CASES[case]
    folder = compile_spec(make(tmp_path, 1), tmp_path / "out")
    rehearse_and_standalone(folder)
    assert_rehearsal_is_standalone(folder)
    built = rehearsal_json(folder)
    trained = [n for n in built["parameters"] if f"accu_grads.{n}" in built["parameters"]]
    expected = {
        name: next(source for pattern, source in table.items() if fnmatch(name, pattern))
        for name in trained
    }
    assert built["gradient_from"] == expected
    assert A in expected.values() and M in expected.values()
