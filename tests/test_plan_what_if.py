"""`msgen plan` as a new user asks it: `--set` pins what it names (`--set mesh.tp=4`
lists only tp = 4), `--set cluster.devices=N` answers "what about N cards?" for
estimate and plan (and compile refuses it), plans that keep the 10% fragmentation
headroom rank first, and `--write` saves a spec that checks where it is written:
the paths it reads rebased, its edits at the lexer's offsets, never a spec that
fails to parse."""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
from pathlib import Path

import pytest

from msgen.cli import EXIT_ERRORS, EXIT_USAGE, main

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
    assert what_if["mesh"] == {"dp": 8, "tp": 2, "pp": 1}


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


# item 2: --write rebases the paths the spec reads -----------------------------------


def test_write_into_another_folder_keeps_the_spec_reading_its_files(tmp_path):
    """The README's own `plan --write` into another folder: hccn(...) is relative to
    the spec, so it is rebased; the data paths are relative to where train.py runs
    (generated/<model>/), so they stay as written; an absolute path stays."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b" / "c").mkdir(parents=True)
    shutil.copy(ROOT / "specs" / "hccn.conf", tmp_path / "a" / "hccn.conf")
    absolute = tmp_path / "abs.conf"
    shutil.copy(ROOT / "specs" / "hccn.conf", absolute)
    text = GPT7B.read_text(encoding="utf-8")
    spec = tmp_path / "a" / "gpt7b.msl"
    spec.write_text(text, encoding="utf-8")
    out = tmp_path / "b" / "c" / "planned.msl"
    code, _, err = run("plan", spec, "--top", "1", "--write", out)
    assert code == 0, err
    written = out.read_text(encoding="utf-8")
    assert 'hccn("../../a/hccn.conf")' in written
    assert 'mindrecord("data/train.mindrecord")' in written  # as in specs/gpt7b.msl
    for command in ("check", "estimate"):
        code, _, err = run(command, out)
        assert code == 0 and "MSL309" not in err, err
    assert run("compile", out, "-o", tmp_path / "gen")[0] == 0
    # several nodes, one of them absolute
    two = text.replace('nodes      = ["192.168.1.10"]', 'nodes = ["192.168.1.10", "192.168.1.11"]')
    two = two.replace('hccn("hccn.conf")', f'[hccn("hccn.conf"), hccn("{absolute.as_posix()}")]')
    two = two.replace("dp = 4 ", "dp = 8 ").replace("micro_batches = 64", "micro_batches = 32")
    (tmp_path / "a" / "abs.conf").write_text(
        "".join(f"address_{d}=10.1.0.{d + 1}\n" for d in range(8))
    )
    two = two.replace(f'hccn("{absolute.as_posix()}")', 'hccn("abs.conf")')
    spec.write_text(two, encoding="utf-8")
    code, _, err = run("plan", spec, "--top", "1", "--write", out, "--force")
    assert code == 0, err
    written = out.read_text(encoding="utf-8")
    assert '[hccn("../../a/hccn.conf"), hccn("../../a/abs.conf")]' in written
    assert run("check", out)[0] == 0


def test_an_absolute_path_is_left_as_written():
    from msgen.syntax.edit import rebased, write_settings

    text = 'cluster {\n    device_ips = [hccn("/etc/hccn.conf"), hccn("x.conf")]\n}\n'
    move = rebased(Path("/srv/specs"), Path("/srv/out"))
    out = write_settings(text, [], "<spec>", move)
    assert (
        out == 'cluster {\n    device_ips = [hccn("/etc/hccn.conf"), hccn("../specs/x.conf")]\n}\n'
    )


# issue 22 H11: offsets as the lexer counts lines --------------------------------------

BREAKS = ["\u2028", "\x85", "\x0c", "\u2029", "\x1c", "\x0b"]


@pytest.mark.parametrize("char", BREAKS, ids=[f"U+{ord(c):04X}" for c in BREAKS])
def test_write_edits_land_where_the_parser_put_the_values(char, tmp_path):
    """str.splitlines breaks at each of these, the MSL lexer at none (in a comment):
    the edits must still replace exactly the values, so the written spec estimates as
    the plan says."""
    from msgen.syntax.edit import write_settings
    from msgen.syntax.parser import parse

    text = TINY.read_text(encoding="utf-8")
    text = text.replace("mesh {", f"# a comment with {char} in it\nmesh {{", 1)
    module, diags = parse(text, "t")
    assert module is not None, diags
    out = write_settings(text, ["mesh.dp=4", "mesh.tp=1", "train.zero=2", "budget.x=1"])
    edited, _ = parse(out, "t")
    assert edited is not None
    assigned = {
        f"{b.kind.name}.{s.target.name}": out_text(out, s.value.span)
        for b in edited.blocks
        for s in b.stmts
        if hasattr(s, "target") and hasattr(s, "value")
    }
    assert (assigned["mesh.dp"], assigned["mesh.tp"], assigned["train.zero"]) == ("4", "1", "2")
    assert char in out and out.count("\n") == text.count("\n") + 4  # the new block only
    # through the command: the written spec estimates as the plan it holds
    spec = tmp_path / "t.msl"
    spec.write_text(text, encoding="utf-8")
    shutil.copy(ROOT / "specs" / "hccn.conf", tmp_path)
    doc = plan_json(spec, "--top", "1")
    code, _, err = run("plan", spec, "--top", "1", "--write", tmp_path / "w.msl")
    assert code == 0, err
    code, out_json, err = run("estimate", tmp_path / "w.msl", "--json")
    assert code == 0, err
    assert json.loads(out_json)["time"]["step_s"] == doc["plans"][0]["step_s"]


def out_text(text: str, span) -> str:
    """The text a span covers, found by walking lines as `\\n` ends them."""
    lines = text.split("\n")
    if span.line == span.end_line:
        return lines[span.line - 1][span.col - 1 : span.end_col - 1]
    raise AssertionError("a value on one line")


def test_hccn_conf_lines_end_at_newline_alone(tmp_path):
    """A U+2028 inside an hccn.conf line does not split it into two entries (a reader
    of /etc/hccn.conf by lines sees one), and a non-ASCII digit is no device number."""
    text = TINY.read_text(encoding="utf-8")
    spec = tmp_path / "t.msl"
    spec.write_text(text, encoding="utf-8")
    good = [f"address_{d}=10.0.0.{d + 1}" for d in range(8)]
    (tmp_path / "hccn.conf").write_text("\n".join(good) + "\n", encoding="utf-8")
    assert run("check", spec)[0] == 0
    joined = good[:2] + [good[2] + "\u2028" + good[3]] + good[4:]
    (tmp_path / "hccn.conf").write_text("\n".join(joined) + "\n", encoding="utf-8")
    code, _, err = run("check", spec)
    assert code == EXIT_ERRORS and "Traceback" not in err
    assert "error[MSL30" in err  # not the 8 addresses splitlines would find
    digit = good[:3] + ["address_\u0663=10.0.0.4"] + good[4:]
    (tmp_path / "hccn.conf").write_text("\n".join(digit) + "\n", encoding="utf-8")
    code, _, err = run("check", spec)
    assert code == EXIT_ERRORS and "error[MSL309]" in err


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


@pytest.mark.parametrize("char", BREAKS[:3], ids=[f"U+{ord(c):04X}" for c in BREAKS[:3]])
def test_fmt_check_numbers_its_diff_as_diagnostics_number_lines(char, tmp_path):
    """The same class in `fmt --check`: the diff's hunk says the line the parser says."""
    from msgen.syntax.parser import parse

    text = TINY.read_text(encoding="utf-8").replace("msl 0.1\n", f"msl 0.1\n# a{char}b\n", 1)
    text = text.replace("    dp = 2\n", "    dp =    2\n", 1)  # fmt puts it back
    spec = tmp_path / "t.msl"
    spec.write_text(text, encoding="utf-8")
    shutil.copy(ROOT / "specs" / "hccn.conf", tmp_path)
    module, _ = parse(text, "t")
    (mesh,) = [b for b in module.blocks if b.kind.name == "mesh"]
    line = mesh.stmts[0].span.line
    code, out, _ = run("fmt", "--check", spec)
    assert code == 3
    removed = [d for d in out.splitlines() if d.startswith("-    dp")]
    assert removed == ["-    dp =    2"]
    at = None  # the old file's line number, walking the hunks
    for d in out.split("\n"):
        if d.startswith("@@"):
            at = int(d.split()[1][1:].split(",")[0])
        elif d.startswith("-    dp"):
            assert at == line
            break
        elif d.startswith((" ", "-")) and not d.startswith("---"):
            at += 1
    else:
        raise AssertionError("no removed dp line in the diff")


def test_a_spec_that_would_not_parse_is_never_written(tmp_path, monkeypatch):
    """Had an edit still landed wrong, --write would have saved whatever came out; the
    edited text is parsed first and nothing is written when it does not parse."""
    import msgen.commands.plan as plan_command

    real = plan_command.write_settings

    def off_by_one(text, settings, file, move):  # an edit at a wrong offset
        return real(text, settings, file, move).replace("mesh {", "mesh {{", 1)

    monkeypatch.setattr(plan_command, "write_settings", off_by_one)
    out = tmp_path / "w.msl"
    code, _, err = run("plan", TINY, "--top", "1", "--write", out)
    assert code == EXIT_USAGE and "the spec with the plan's settings is wrong" in err
    assert "Traceback" not in err and not out.exists()


def test_write_saves_the_set_values_with_the_plan(tmp_path):
    """`plan --set model.seq=64 --set mesh.tp=1 --write F`: F holds both, and estimates as
    the plan that was printed."""
    from msgen.compiler import analyze

    doc = plan_json(TINY, "--top", "1", "--set", "model.seq=64", "--set", "mesh.tp=1")
    (top,) = doc["plans"]
    assert top["set"][0] == "model.seq=64" and values(top)["mesh.tp"] == "1"
    out = tmp_path / "w.msl"
    argv = ["plan", TINY, "--top", "1", "--set", "model.seq=64", "--set", "mesh.tp=1"]
    code, _, err = run(*argv, "--write", out)
    assert code == 0, err
    written = analyze(out)
    assert written.ok and written.spec.model.dims["seq"] == 64 and written.spec.mesh.tp == 1
    code, est, err = run("estimate", out, "--json")
    assert code == 0 and json.loads(est)["time"]["step_s"] == top["step_s"]
