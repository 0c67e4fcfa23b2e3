"""What the step time of a mixture of experts has been checked against, and the label
`estimate` and `plan` put on it.

Every run of specs/validation/published.json was dense until one MoE run was added
as a check (never fitted on): ModelLink's Mixtral-8x7B with a capacity factor of 1.1
and ep 2 inside a server (specs/validation/mixtral_8x7b_mindspeed.msl). The label's
one home is msgen.estimate.time_report.MOE_CHECKS; these tests hold it to that file
(the same runs, their stated errors the model's errors now, what each exercised read
from its spec) and hold the label to the rule docs/language.md states: a spec's MoE
step time is validated only where a checked run had its dispatch (capacity or
dropless), its device, and its ep all-to-alls inside a server or across servers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from msgen.analysis.plan import Plan
from msgen.cli import main
from msgen.compiler import analyze, analyze_text
from msgen.estimate.memory import estimate
from msgen.estimate.time import step_time
from msgen.estimate.time_report import MOE_CHECKS, moe_validation

ROOT = Path(__file__).resolve().parents[1]
VALIDATION = ROOT / "specs" / "validation"
PUBLISHED = json.loads((VALIDATION / "published.json").read_text())["runs"]
TINY_MOE = ROOT / "tests" / "specs" / "tiny_moe.msl"


def moe_ops(spec) -> list:
    return [op for g in (spec.network, *spec.layers.values()) for op in g.ops if op.kind == "moe"]


def published_moe_runs() -> list[dict]:
    return [r for r in PUBLISHED if moe_ops(analyze(VALIDATION / r["spec"], r["set"]).spec)]


def test_the_labels_checks_are_the_published_moe_runs_and_none_is_fitted():
    runs = published_moe_runs()
    assert runs, "published.json holds no MoE run: the label must then say none"
    assert {(r["spec"], r["source"]) for r in runs} == {(c.spec, c.source) for c in MOE_CHECKS}
    assert all(r["role"] == "check" for r in runs)


@pytest.mark.parametrize("check", MOE_CHECKS, ids=lambda c: c.spec)
def test_each_stated_error_is_the_models_error_now(check):
    (run,) = [r for r in PUBLISHED if r["spec"] == check.spec and r["source"] == check.source]
    result = analyze(VALIDATION / run["spec"], run["set"])
    plan = Plan(result.spec, result.facts)
    predicted = step_time(plan, estimate(plan), fused=frozenset(run["kernels"])).step_s
    assert predicted / run["step"] - 1 == pytest.approx(check.error, abs=0.0005)


@pytest.mark.parametrize("check", MOE_CHECKS, ids=lambda c: c.spec)
def test_what_each_check_exercised_is_its_specs(check):
    spec = analyze(VALIDATION / check.spec).spec
    capacities = {op.args.get("capacity") for op in moe_ops(spec)}
    assert {"dropless" if c is None else "capacity" for c in capacities} == {check.dispatch}
    assert spec.cluster.device == check.device
    ep, tp = spec.mesh.ep, spec.mesh.tp
    assert (ep > 1 and ep * tp > spec.cluster.per_node) == check.ep_across_servers
    # a run lies within what it checked
    assert moe_validation(spec, ep, tp).validated


def estimate_out(capsys, spec: Path, *argv: str) -> tuple[str, dict]:
    main(["estimate", str(spec), *argv])
    text = capsys.readouterr().out
    main(["estimate", str(spec), *argv, "--json"])
    return text, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("name", ["mixtral_8x7b", "qwen3_30b_a3b"])
def test_a_dropless_moe_estimate_is_labelled_not_validated(capsys, name):
    text, doc = estimate_out(capsys, VALIDATION / f"{name}.msl")
    label = doc["time"]["moe_validation"]
    assert label["validated"] is False
    assert "dropless dispatch" in label["reason"]
    assert [c["spec"] for c in label["checked_against"]] == [c.spec for c in MOE_CHECKS]
    assert "MoE step time NOT VALIDATED: no published run checks dropless dispatch" in text


def test_the_svg_summary_carries_the_label(capsys, tmp_path):
    for spec, label in [
        (VALIDATION / "qwen3_30b_a3b.msl", "; MoE step time NOT VALIDATED"),
        (VALIDATION / "mixtral_8x7b_mindspeed.msl", "; MoE step time checked"),
        (ROOT / "specs" / "gpt7b.msl", ""),
    ]:
        svg = tmp_path / f"{spec.stem}.svg"
        main(["estimate", str(spec), "--svg", str(svg)])
        capsys.readouterr()
        (summary,) = re.findall(r'y="40" font-size="11">([^<]*)<', svg.read_text())
        assert summary.startswith("step ")
        assert summary.endswith(label) if label else "MoE" not in summary


def test_the_checked_run_itself_is_labelled_with_what_it_was_checked_against(capsys):
    text, doc = estimate_out(capsys, VALIDATION / "mixtral_8x7b_mindspeed.msl")
    label = doc["time"]["moe_validation"]
    assert label["validated"] is True and label["reason"] is None
    (check,) = label["checked_against"]
    assert check["error"] == pytest.approx(-0.045) and check["dispatch"] == "capacity"
    assert "MoE step time: checked, not fitted, against published runs" in text
    assert "Mixtral-8x7B, capacity 1.1, ep 2 inside a server" in text
    assert "-4.5%" in text


def test_another_device_or_ep_across_servers_is_not_validated(capsys):
    spec = VALIDATION / "mixtral_8x7b_mindspeed.msl"
    _, doc = estimate_out(capsys, spec, "--set", "cluster.device=a100_80g")
    assert doc["time"]["moe_validation"]["reason"] == (
        "no published run checks a mixture of experts on a100_80g"
    )
    # dp 8 x tp 2: an ep group of 8 spans 16 devices, two servers of 8
    _, doc = estimate_out(
        capsys,
        spec,
        *("--set", "mesh.dp=8", "--set", "mesh.tp=2", "--set", "mesh.pp=1"),
        *("--set", "mesh.ep=8", "--set", "pipeline.micro_batches=16"),
    )
    assert doc["time"]["moe_validation"]["reason"] == (
        "no published run checks ep all-to-alls across servers"
    )


def test_a_dense_spec_carries_no_moe_label(capsys):
    text, doc = estimate_out(capsys, ROOT / "specs" / "gpt7b.msl")
    assert doc["time"]["moe_validation"] is None
    assert "MoE" not in text


# A tiny MoE with a capacity on two servers of 4: its plans with ep x tp > 4 put their
# ep all-to-alls across servers, the others inside one.
TWO_SERVERS = (
    TINY_MOE.read_text()
    .replace("shared_ffn = ffn, aux_loss", "shared_ffn = ffn, capacity = 1.25, aux_loss")
    .replace("per_node = 8", "per_node = 4")
    .replace('nodes    = ["127.0.0.1"]', 'nodes    = ["127.0.0.1", "127.0.0.2"]')
)


def test_each_plan_is_labelled_by_where_its_ep_groups_run(tmp_path, capsys):
    spec = tmp_path / "tiny_moe.msl"
    spec.write_text(TWO_SERVERS)
    assert analyze_text(TWO_SERVERS, str(spec), tmp_path).ok
    main(["plan", str(spec), "--top", "1000", "--json"])
    plans = json.loads(capsys.readouterr().out)["plans"]
    main(["plan", str(spec), "--top", "1000"])
    text = capsys.readouterr().out
    blocks = re.split(r"\n\n(?=\d+\. )", text)[1:]
    assert len(blocks) == len(plans)
    across = set()
    for plan, block in zip(plans, blocks, strict=True):
        sets = dict(s.split("=", 1) for s in plan["set"])
        ep, tp = int(sets["mesh.ep"]), int(sets["mesh.tp"])
        crosses = ep > 1 and ep * tp > 4
        across.add(crosses)
        assert plan["time"]["moe_validation"]["validated"] is not crosses, plan["set"]
        assert ("[MoE time NOT VALIDATED]" in block.splitlines()[0]) is crosses, block
    assert across == {True, False}, "the search should reach both kinds of layout"
    assert "MoE step time NOT VALIDATED for the plans marked so" in text
