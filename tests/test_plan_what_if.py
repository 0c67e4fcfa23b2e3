"""`msgen plan` as a new user asks it: `--set` pins what it names (`--set mesh.tp=4`
lists only tp = 4), `--set cluster.devices=N` answers "what about N cards?" for
estimate and plan (and compile refuses it), plans that keep the 10% fragmentation
headroom rank first, and a what-if built on the IR is the spec its `--set` flags
compile."""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest

from msgen.base.status import EXIT_ERRORS, EXIT_USAGE
from msgen.cli import main

ROOT = Path(__file__).resolve().parent.parent
GPT7B = ROOT / "specs" / "gpt7b.msl"
TINY = ROOT / "specs" / "tiny.msl"


def run(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return code, out.getvalue(), err.getvalue()


def plan_json(*argv) -> dict:
    code, out, err = run("plan", *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def values(plan: dict) -> dict[str, str]:
    return dict(s.split("=", 1) for s in plan["set"])


# item 4: --set in plan --------------------------------------------------------------


def test_a_key_given_with_set_is_pinned_in_every_plan():
    doc = plan_json(GPT7B, "--top", "40", "--set", "mesh.tp=4")
    assert doc["plans"] and all(values(p)["mesh.tp"] == "4" for p in doc["plans"])
    assert "mesh.tp=4" in doc["spec"]["set"]
    # without the pin the search finds faster layouts of other tp first
    free = plan_json(GPT7B, "--top", "40")
    assert {values(p)["mesh.tp"] for p in free["plans"]} != {"4"}
    # two pins: both kept; a pinned chunk count pins the schedule that holds it
    doc = plan_json(TINY, "--top", "50", "--set", "train.zero=0", "--set", "mesh.pp=2")
    assert doc["plans"]
    assert all(values(p)["train.zero"] == "0" and values(p)["mesh.pp"] == "2" for p in doc["plans"])
    doc = plan_json(TINY, "--top", "50", "--set", "pipeline.schedule=gpipe")
    assert {values(p)["pipeline.schedule"] for p in doc["plans"]} == {"gpipe"}


def test_plan_and_estimate_share_the_one_set_declaration():
    from msgen.cli import build_parser

    def option(command):
        (sub,) = (a for a in build_parser()._actions if hasattr(a, "choices") and a.choices)
        parser = sub.choices[command]
        (act,) = (a for a in parser._actions if "--set" in a.option_strings)
        return (act.metavar, act.help, act.default)

    assert option("plan") == option("estimate") == option("compile")


def hand_written_16(tmp_path: Path) -> Path:
    """gpt7b on two servers written out by hand, as a user with the addresses would."""
    text = GPT7B.read_text(encoding="utf-8")
    text = text.replace('nodes      = ["192.168.1.10"]', 'nodes = ["192.168.1.10", "192.168.1.11"]')
    text = text.replace('device_ips = hccn("hccn.conf")', "")
    text = text.replace("dp = 4 ", "dp = 8 ").replace("micro_batches = 64", "micro_batches = 32")
    path = tmp_path / "gpt7b_16.msl"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_device_count_what_if_is_the_cluster_written_out(tmp_path):
    """`--set cluster.devices=16` estimates the spec as if its 16 devices' servers were
    listed: the same numbers as the spec with two nodes written by hand (dp and
    micro_batches re-derived as any --set of the devices does)."""
    code, out, err = run("estimate", GPT7B, "--json", "--set", "cluster.devices=16")
    assert code == 0, err
    assert "note: --set keeps the global batch: dp 4 → 8, micro_batches 64 → 32" in err
    what_if = json.loads(out)
    code, out, err = run("estimate", hand_written_16(tmp_path), "--json")
    assert code == 0, err
    by_hand = json.loads(out)
    for doc in (what_if, by_hand):
        doc.pop("what_if", None)
        doc.pop("spec", None)
    assert what_if == by_hand
    assert what_if["mesh"] == {"dp": 8, "tp": 2, "pp": 1, "ep": 1}


def test_plan_searches_the_devices_of_the_what_if(tmp_path):
    doc = plan_json(GPT7B, "--top", "3", "--set", "cluster.devices=16")
    assert len(doc["plans"]) == 3
    for p in doc["plans"]:
        v = values(p)
        assert int(v["mesh.dp"]) * int(v["mesh.tp"]) * int(v["mesh.pp"]) == 16
        # the plan's flags hold the what-if too: estimate with them gives the same step
        assert p["set"][0] == "cluster.devices=16"
        sets = [a for s in p["set"] for a in ("--set", s)]
        code, out, err = run("estimate", GPT7B, "--json", *sets)
        assert code == 0, err
        assert json.loads(out)["time"]["step_s"] == p["step_s"]
    # the first plan on 16 devices is at least as fast per step as on 8 (half the batch each)
    eight = plan_json(GPT7B, "--top", "1")
    assert doc["plans"][0]["step_s"] < eight["plans"][0]["step_s"]


@pytest.mark.parametrize(
    "value, says",
    [
        (
            "12",
            "cluster.devices = 12 is not a whole number of servers of per_node = 8: try 8 or 16",
        ),
        ("0", "cluster.devices = 0 is not a whole number of servers of per_node = 8: try 8\n"),
        ("sixteen", "cluster.devices is a whole number of devices"),
        ("9" * 5000, "cluster.devices is a whole number of devices"),
        ("1000000", "cluster.devices = 1000000 is more than 16,384 servers"),
    ],
)
def test_a_device_count_that_names_no_cluster_is_one_line(value, says):
    code, out, err = run("estimate", GPT7B, "--set", f"cluster.devices={value}")
    assert code == EXIT_ERRORS and out == ""
    assert f"error[MSL108]: --set {says}" in err and "Traceback" not in err


def test_compile_and_write_refuse_made_up_servers(tmp_path):
    out = tmp_path / "out"
    code, _, err = run("compile", GPT7B, "-o", out, "--set", "cluster.devices=16")
    assert code == EXIT_ERRORS
    assert "error[MSL104]: --set cluster.devices makes up the added servers' addresses" in err
    assert "list every server's address in cluster.nodes" in err
    assert not out.exists()
    written = tmp_path / "w.msl"
    code, _, err = run("plan", GPT7B, "--set", "cluster.devices=16", "--write", written)
    assert code == EXIT_USAGE and "list every server in the spec's cluster.nodes" in err
    assert not written.exists()


# item 3: headroom ---------------------------------------------------------------------


def keeps_headroom(p: dict) -> bool:
    """Independent of the planner: every stage's peak plus 10% (rounded up) within the
    budget; the peak stage is the largest, so it decides."""
    return p["peak_bytes"] + math.ceil(p["peak_bytes"] * 0.1) <= p["budget_bytes"]


def test_plans_that_keep_the_headroom_rank_first_and_the_others_are_flagged():
    doc = plan_json(GPT7B, "--top", "1000")
    kept = [keeps_headroom(p) for p in doc["plans"]]
    assert kept == sorted(kept, reverse=True)  # every True before every False
    assert kept[0] and not all(kept)
    assert [p["headroom_kept"] for p in doc["plans"]] == kept
    # within each group, by step time
    for flag in (True, False):
        steps = [p["step_s"] for p, k in zip(doc["plans"], kept, strict=True) if k is flag]
        assert steps == sorted(steps)
    code, out, _ = run("plan", GPT7B, "--top", "1000")
    tight = [line for line in out.splitlines() if line[:1].isdigit()]
    assert ["TIGHT" in line for line in tight] == [not k for k in kept]


def test_the_spec_written_by_default_checks_without_a_warning(tmp_path):
    out = tmp_path / "planned.msl"
    code, _, err = run("plan", GPT7B, "--top", "1", "--write", out)
    assert code == 0, err
    code, _, err = run("check", out)
    assert (code, err) == (0, "")


def tight_budget(spec: Path) -> str:
    """A budget every layout fits only without its headroom: just above the lowest peak."""
    doc = plan_json(spec, "--top", "1", "--objective", "memory")
    peak = doc["plans"][0]["peak_bytes"]
    return f"budget.device_memory={math.ceil(peak * 1.02 / 2**20)} MiB"


def test_a_tight_plan_is_written_only_when_picked(tmp_path):
    budget = tight_budget(TINY)
    doc = plan_json(TINY, "--top", "5", "--set", budget)
    assert doc["plans"] and not any(p["headroom_kept"] for p in doc["plans"])
    out = tmp_path / "planned.msl"
    code, _, err = run("plan", TINY, "--set", budget, "--write", out)
    assert code == EXIT_USAGE and "--pick" in err and "MSL402" in err
    assert not out.exists()
    code, _, err = run("plan", TINY, "--set", budget, "--write", out, "--pick", "1")
    assert code == 0, err
    code, _, err = run("check", out)
    assert code == 0 and "warning[MSL402]" in err


# issue 21 item 7: one "spec with these settings" ---------------------------------------


def ir_of(spec) -> dict:
    """What a spec means for the estimate and the generated code, spans and the text's
    hash aside."""

    def plain(node):
        if hasattr(node, "model_dump"):
            node = node.model_dump(mode="json")
        if isinstance(node, dict):
            return {k: plain(v) for k, v in node.items() if "span" not in k and k != "sha256"}
        if isinstance(node, list | tuple):
            return [plain(v) for v in node]
        return node

    return plain(spec)


@pytest.mark.parametrize("name", ["tiny.msl", "gpt7b.msl"])
def test_a_what_if_is_the_spec_its_set_flags_compile(name):
    """The planner's layouts and the budget's suggested changes are built on the IR
    (msgen.estimate.whatif); `--set` with the same flags goes through the text and
    lowering (msgen.compiler). Both follow one rule for what the settings leave to
    follow, so they are the same spec: compared field by field, spans aside."""
    import random

    from msgen.compiler import analyze
    from msgen.estimate.planner import layouts, recompute_modes, settings_of
    from msgen.estimate.whatif import apply, candidates, describe

    path = ROOT / "specs" / name
    base = analyze(path)
    spec, facts = base.spec, base.facts
    layer_names = sorted({n.args["layer"] for n in spec.network.ops if n.kind == "repeat"})
    total = sum(n.args["count"] for n in spec.network.ops if n.kind == "repeat")
    plans = layouts(spec, total, recompute_modes(spec, layer_names, facts.graphs))
    cases = [(tuple(p.sets), settings_of(p)) for p in random.Random(7).sample(plans, 12)]
    cases += [
        (describe(spec, dict(c.settings))[1], dict(c.settings)) for c in candidates(spec, facts)
    ]
    assert len(cases) > 15
    for sets, settings in cases:
        variant = apply(spec, settings)
        compiled = analyze(path, list(sets))
        if variant is None or compiled.spec is None:
            assert variant is None and compiled.spec is None, sets
            continue
        assert ir_of(variant) == ir_of(compiled.spec), sets
