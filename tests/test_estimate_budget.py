"""The budget pass: MSL401 with a breakdown and changes that fit, MSL402 for a
stage without headroom, and the what-if estimates behind the suggestions."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from test_estimate import ROOT, SPECS, checked, estimate_of, spec_text

from msgen.analysis.plan import Plan
from msgen.cli import main
from msgen.compiler import analyze, analyze_text
from msgen.estimate.memory import GiB, estimate
from msgen.estimate.output import estimate_report
from msgen.estimate.whatif import candidates, estimate_variant, suggestions


def over_budget_gpt7b(folder: Path) -> Path:
    """gpt7b without recompute and with 3 sequences per micro-batch: 67.35 GiB."""
    text = (SPECS / "gpt7b.msl").read_text()
    for old, new in (
        ("decoder = full ", "decoder = none "),
        ("micro_batch  = 1 ", "micro_batch  = 3 "),
        ("global_batch = 256 ", "global_batch = 768 "),
    ):
        assert old in text
        text = text.replace(old, new)
    shutil.copy(SPECS / "hccn.conf", folder / "hccn.conf")
    path = folder / "over.msl"
    path.write_text(text)
    return path


def budget_diags(result, code="MSL401"):
    return [d for d in result.diagnostics if d.code == code]


def test_over_budget_is_msl401_at_the_budget_line(tmp_path):
    path = over_budget_gpt7b(tmp_path)
    result = analyze(path)
    (diag,) = budget_diags(result)
    assert diag.is_error
    line = result.text.splitlines()[diag.span.line - 1]
    assert line.strip().startswith("device_memory = 58 GiB")
    assert "stage 0 needs 67.35 GiB per device, 9.35 GiB over the 58.00 GiB budget" in diag.message
    assert "weights 15.52 + grads 3.10 + accumulation 12.42" in diag.hint
    assert "changes that fit every stage:" in diag.hint
    assert "recompute decoder = select(att): stage 0 -12.00 GiB, to 55.35 GiB" in diag.hint


def test_without_a_budget_block_the_device_line(tmp_path):
    result = analyze(SPECS / "validation" / "korthikanti22b.msl")
    (diag,) = budget_diags(result)
    assert result.text.splitlines()[diag.span.line - 1].strip().startswith("device   = a100_80g")


def test_each_suggestion_fits_and_matches_the_spec_it_names(tmp_path):
    result = analyze(over_budget_gpt7b(tmp_path))
    found, fit = suggestions(result.spec, result.facts)
    assert fit and 2 <= len(found) <= 3
    for s in found:
        changed = analyze(tmp_path / "over.msl", list(s.overrides))
        assert changed.ok, (s.label, changed.diagnostics)
        assert not budget_diags(changed)
        real = estimate(Plan(changed.spec, changed.facts))
        assert estimate_report(real) == estimate_report(s.estimate), s.label


def test_check_fails_then_passes_with_a_suggested_change(tmp_path, capsys):
    path = over_budget_gpt7b(tmp_path)
    assert main(["check", str(path)]) == 1
    assert "error[MSL401]" in capsys.readouterr().err
    fixed = path.read_text().replace("decoder = none ", "decoder = select(att) ")
    path.write_text(fixed)
    assert main(["check", str(path)]) == 0
    assert "MSL401" not in capsys.readouterr().err


def test_mesh_what_if_rebatches_like_the_text_would(tmp_path):
    # dp 2 x tp 4 halves the batch; the variant re-derives the shapes lowering made
    result = analyze(SPECS / "gpt7b.msl")
    settings = {"mesh.dp": 2, "mesh.tp": 4, "mesh.pp": 1}
    predicted = estimate_variant(result.spec, settings)
    sets = ["mesh.dp=2", "mesh.tp=4", "pipeline.micro_batches=128"]
    real = analyze(SPECS / "gpt7b.msl", sets)
    assert real.ok
    assert estimate_report(predicted) == estimate_report(estimate(Plan(real.spec, real.facts)))


def test_invalid_changes_are_not_suggested():
    result = checked(spec_text(dp=8))
    assert (
        estimate_variant(result.spec, {"mesh.dp": 1, "mesh.tp": 8, "mesh.pp": 1}) is None
    )  # tp 8 > 4 heads
    assert (
        estimate_variant(result.spec, {"mesh.dp": 1, "mesh.tp": 1, "mesh.pp": 8}) is None
    )  # 8 stages, 4 layers
    assert estimate_variant(result.spec, {"mesh.dp": 2, "mesh.tp": 4, "mesh.pp": 1}) is not None
    assert estimate_variant(result.spec, {"train.micro_batch": 3}) is None  # global batch 8


def test_when_nothing_fits_say_so():
    result = checked(spec_text(dp=2, tp=2, budget="1 MiB"))
    (diag,) = budget_diags(result)
    assert "no change msgen tried fits, alone or in pairs" in diag.hint


def test_pairs_when_no_single_change_fits():
    text = spec_text(dp=2, micro_batch=8, layers=8, dims=BIG_DIMS)
    result = checked(text)
    singles = [
        estimate_variant(result.spec, dict(c.settings))
        for c in candidates(result.spec, result.facts)
    ]
    best_single = min(e.peak.total_bytes for e in singles if e is not None)
    result = checked(text + budget(best_single - 2**20))
    found, fit = suggestions(result.spec, result.facts)
    assert fit and found and all(" and " in s.label for s in found)
    for s in found:
        assert s.estimate.fits
        changed = checked(text + budget(best_single - 2**20), s.overrides)
        assert not budget_diags(changed)


BIG_DIMS = "vocab = 512\n hidden = 256\n heads = 8\n ffn = 4 * hidden\n seq = 1024"


def budget(nbytes: float) -> str:
    return f"budget {{\n device_memory = {int(nbytes) // 1024} KiB\n}}\n"


def test_headroom_warning_when_total_fits_but_not_with_10_percent():
    total = estimate_of(spec_text()).stages[0].total_bytes
    result = checked(spec_text() + budget(total * 1.05 + 1024))
    (diag,) = budget_diags(result, "MSL402")
    assert not diag.is_error and not budget_diags(result)
    roomy = checked(spec_text() + budget(total * 1.2))
    assert not budget_diags(roomy, "MSL402")


def test_budget_pass_waits_for_other_errors():
    bad = spec_text(budget="1 MiB").replace("zero = 0", "zero = 7")
    result = analyze_text(bad, "t.msl", ROOT)
    codes = {d.code for d in result.diagnostics}
    assert "MSL503" in codes and "MSL401" not in codes


@pytest.mark.parametrize("spec", ["gpt7b.msl", "tiny.msl", "validation/gpt1t_4096.msl"])
def test_shipped_specs_fit(spec):
    result = analyze(SPECS / spec)
    assert result.ok and not budget_diags(result)


def test_estimate_json_of_a_suggestion_is_plain_data(tmp_path):
    result = analyze(over_budget_gpt7b(tmp_path))
    found, _ = suggestions(result.spec, result.facts)
    json.dumps(estimate_report(found[0].estimate).model_dump(mode="json"))
    assert found[0].estimate.budget_bytes == 58 * GiB
