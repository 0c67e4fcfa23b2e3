"""Exact parameter counts of the two published mixtures of experts, from specs written
from their published config.json files, against the published totals (the issue's
figures, which the configs multiply out to):

Mixtral-8x7B: per layer 8 experts x 3 x 4096 x 14336 + router 4096 x 8 + attention
4096 x (4096 + 2 x 1024) + 4096 x 4096 + 2 norms x 4096; 32 layers, embedding and
output 2 x 32000 x 4096, final norm 4096: 46,702,792,704; active (2 of 8 experts):
12,879,925,248.

Qwen3-30B-A3B: per layer 128 experts x 3 x 2048 x 768 + router 2048 x 128 + attention
2048 x (4096 + 2 x 512) + 4096 x 2048 + q/k norms 2 x 128 + 2 norms x 2048; 48
layers, embedding and output 2 x 151936 x 2048, final norm 2048: 30,532,122,624;
active (8 of 128): 3,353,032,704.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = {
    "mixtral_8x7b": (46_702_792_704, 12_879_925_248),
    "qwen3_30b_a3b": (30_532_122_624, 3_353_032_704),
}


def estimate(name: str, *extra: str) -> str:
    spec = ROOT / "specs" / "validation" / f"{name}.msl"
    run = subprocess.run(
        [sys.executable, "-m", "msgen.cli", "estimate", str(spec), *extra],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert run.returncode in (0, 4), run.stderr  # 4: over budget is still an estimate
    return run.stdout


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_estimate_json_reports_the_published_total_and_active_counts(name):
    doc = json.loads(estimate(name, "--json"))
    assert (doc["params_total"], doc["params_active"]) == PUBLISHED[name]


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_estimate_text_reports_the_active_count(name):
    total, active = PUBLISHED[name]
    text = estimate(name)
    assert f"{total:,} parameters" in text
    assert f"active per token: {active:,} parameters" in text


def test_a_dense_spec_prints_no_active_line_and_reports_active_equal_to_total():
    spec = ROOT / "specs" / "tiny_llama.msl"
    run = subprocess.run(
        [sys.executable, "-m", "msgen.cli", "estimate", str(spec), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    doc = json.loads(run.stdout)
    assert doc["params_active"] == doc["params_total"]
