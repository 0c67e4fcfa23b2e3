"""FLOPs per op and per step against the closed forms: Korthikanti et al. 2022,
Appendix A, eq. 7 for model FLOPs, and Narayanan et al. 2021 for the hardware
FLOPs of full recompute, exactly, on specs written in MSL."""

from __future__ import annotations

from pathlib import Path

import pytest

from msgen.analysis.plan import Plan
from msgen.compiler import analyze
from msgen.estimate.flops import step_flops, tokens_per_step
from tests.test_estimate import checked, spec_text

ROOT = Path(__file__).resolve().parent.parent


def eq7(B, L, s, h, V) -> int:
    """72·B·L·s·h²·(1 + s/6h + V/12hL), multiplied out so it stays an integer."""
    return 72 * B * L * s * h * h + 12 * B * L * s * s * h + 6 * B * s * h * V


def full_recompute(B, L, s, h, V) -> int:
    """96·B·s·L·h²·(1 + s/6h + V/16Lh) (Narayanan et al. 2021, eq. 3)."""
    return 96 * B * L * s * h * h + 16 * B * L * s * s * h + 6 * B * s * h * V


def flops_of(text, overrides=()):
    result = checked(text, overrides)
    return step_flops(Plan(result.spec, result.facts))


DIMS = "vocab = {V}\n hidden = {h}\n heads = {a}\n ffn = 4 * hidden\n seq = {s}"


@pytest.mark.parametrize(
    "V, h, a, s, layers, dp, tp, pp, micro_batch, micro_batches",
    [
        (512, 64, 4, 32, 4, 1, 1, 1, 1, 1),
        (512, 64, 4, 32, 4, 2, 2, 1, 3, 2),
        (1024, 128, 8, 64, 6, 1, 4, 2, 2, 4),
        (51200, 6144, 64, 2048, 48, 1, 8, 1, 4, 1),  # the 22B model of Table 5
    ],
)
def test_model_flops_are_korthikanti_eq7(
    V, h, a, s, layers, dp, tp, pp, micro_batch, micro_batches
):
    text = spec_text(
        dims=DIMS.format(V=V, h=h, a=a, s=s),
        layers=layers,
        dp=dp,
        tp=tp,
        pp=pp,
        micro_batch=micro_batch,
        micro_batches=micro_batches,
    )
    B = micro_batch * dp * micro_batches
    flops = flops_of(text)
    assert flops.model == eq7(B, layers, s, h, V)
    # nothing recomputed, attention not flash: the kernels compute exactly that
    assert flops.hardware == flops.model


def test_recompute_adds_hardware_flops_never_model_flops():
    B, L, s, h, V = 2, 4, 32, 64, 512
    text = spec_text(dims=DIMS.format(V=V, h=h, a=4, s=s), layers=L, micro_batch=2)
    full = flops_of(text, ["recompute.decoder=full"])
    assert full.model == eq7(B, L, s, h, V)
    assert full.hardware == full_recompute(B, L, s, h, V)
    select = flops_of(text, ["recompute.decoder=select(att)"])
    assert select.model == eq7(B, L, s, h, V)
    # the attention core's forward again: QK^T and PV, 4·B·s²·h per layer
    assert select.hardware == eq7(B, L, s, h, V) + 4 * B * L * s * s * h


def test_causal_flash_kernel_skips_the_masked_half():
    B, L, s, h, V = 1, 4, 32, 64, 512
    dims = DIMS.format(V=V, h=h, a=4, s=s)
    plain = flops_of(spec_text(dims=dims, layers=L))
    flash_layer = spec_text(dims=dims, layers=L).replace(
        "causal = true, dropout = 0.1", "causal = true, flash = true"
    )
    flash = flops_of(flash_layer)
    assert flash.model == plain.model == eq7(B, L, s, h, V)
    # forward: half of QK^T and PV (2·B·s²·h of 4·B·s²·h); backward: 5 matmuls
    # for the forward's 2 (FlashAttention-2 recomputes the scores), also halved:
    # 5·B·s²·h where the model counts 8·B·s²·h
    assert flash.hardware == plain.model - (2 + 3) * B * L * s * s * h


def test_specs_tokens_and_flops():
    result = analyze(ROOT / "specs" / "gpt7b.msl")
    plan = Plan(result.spec, result.facts)
    assert tokens_per_step(plan) == 256 * 2048
    assert step_flops(plan).model == eq7(256, 32, 2048, 4096, 50304)


def test_a_sliding_window_scores_only_its_band():
    """window_cells counts the (query, key) pairs a window of W sees, which the flash
    kernel's band mode computes (model FLOPs still count every pair)."""
    import numpy as np

    from msgen.ops.attention import window_cells

    for seq, window in ((8, 1), (8, 3), (8, 8), (8, 20), (4096, 1024)):
        query, key = np.ogrid[:seq, :seq]
        seen = (key <= query) & (query - key < window)
        assert window_cells(seq, window) == int(seen.sum()), (seq, window)
