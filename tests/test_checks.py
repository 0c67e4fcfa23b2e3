"""The topology, pipeline and train passes on small edits of tests/cases/base.msl:
what they accept, what they report and where, and that they never raise."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from msgen.analysis.facts import Facts
from msgen.checks import pipeline, topology, train
from msgen.compiler import Result, analyze_text
from msgen.ir.devices import DEVICES

ROOT = Path(__file__).resolve().parent.parent
CASES = Path(__file__).resolve().parent / "cases"
BASE = (CASES / "base.msl").read_text()
SPECS = sorted((ROOT / "specs").glob("*.msl"))


def edit(*edits: tuple[str, str], text: str = BASE) -> str:
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


def check(*edits: tuple[str, str], files: dict[str, str] | None = None, tmp: Path | None = None):
    base_dir = CASES
    if files:
        assert tmp is not None
        for name, content in files.items():
            (tmp / name).write_text(content)
        base_dir = tmp
    return analyze_text(edit(*edits), "spec.msl", base_dir)


def codes(result: Result) -> list[str]:
    return [d.code for d in result.diagnostics]


def only(result: Result, code: str):
    """The single diagnostic of the result, which must have `code`."""
    assert codes(result) == [code], [(d.code, d.message) for d in result.diagnostics]
    return result.diagnostics[0]


NODES = ('nodes    = ["192.168.1.10"]', 'nodes    = ["192.168.1.10", "192.168.1.11"]')
PER_NODE_4 = ("per_node = 8", "per_node = 4")


def device_ips(value: str) -> tuple[str, str]:
    """Two nodes, with these device IPs."""
    return (NODES[0] + "\n", NODES[1] + f"\n    device_ips = {value}\n")


def hccn(node: int, n: int) -> str:
    return "".join(
        f"address_{i}=192.98.{10 + i}.{node}\nnetmask_{i}=255.255.255.0\n" for i in range(n)
    )


# clean specs ------------------------------------------------------------------------


def test_base_is_clean():
    assert codes(check()) == []


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.name)
def test_shipped_specs_have_no_errors(spec):
    result = analyze_text(spec.read_text(), spec.name, spec.parent)
    assert result.ok, [(d.code, d.message) for d in result.diagnostics]


@pytest.mark.parametrize("run", [topology.run, pipeline.run, train.run])
def test_passes_stand_alone_on_empty_facts(run):
    """Each pass runs on a lowered spec whatever the graph passes learnt."""
    spec = check().spec
    assert run(spec, Facts()) == []


# topology ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, problem",
    [
        ("10.0.0.1", None),
        ("127.0.0.1", None),
        ("192.168.1.10", None),
        ("node01", "a host name, not an IPv4 address"),
        ("gpu-3", "a host name, not an IPv4 address"),
        ("node01.example.com", "not an IPv4 address"),
        ("10.0.0", "not an IPv4 address"),
        ("10.0.0.256", "not an IPv4 address"),
        ("010.0.0.1", "not an IPv4 address"),
        (" 10.0.0.1", "not an IPv4 address"),
        ("::1", "not an IPv4 address"),
        ("", "not an IPv4 address"),
        ("0.0.0.0", "the unspecified address"),
        ("224.0.0.1", "a multicast address"),
        ("255.255.255.255", "a reserved address"),
    ],
)
def test_ipv4_problem(text, problem):
    assert topology.ipv4_problem(text) == problem


@pytest.mark.parametrize("device", sorted(DEVICES))
def test_every_catalogue_device_is_accepted(device):
    assert codes(check(("device   = ascend910b", f"device   = {device}"))) == []


def test_catalogue_names_the_issue_list():
    assert {"ascend910b", "ascend910b3", "ascend910b4", "ascend910a", "a100_80g",
            "h100_80g"} <= set(DEVICES)  # fmt: skip


def test_factorizations_keep_tp_in_a_server_and_dividing_heads():
    spec = check().spec
    found = topology.factorizations(16, spec, layers=2)
    assert all(d * t * p == 16 for d, t, p in found)
    assert all(t in (1, 2, 4) for _, t, _ in found)  # heads = 4, per_node = 8
    assert all(p <= 2 for _, _, p in found)  # two layers
    assert found[0] == (4, 2, 2)  # keeps tp = 2 and pp = 2 from the written mesh


def test_mesh_mismatch_points_at_the_mesh_keyword():
    d = only(check(("    pp = 2\n", "    pp = 1\n")), "MSL301")
    assert (d.span.line, d.span.col, d.span.end_col) == (19, 1, 5)
    assert "dp * tp * pp = 2 * 2 * 1 = 4 devices" in d.message
    # changing dp alone is the least disruptive fix, so it comes first
    assert d.hint.startswith("dp * tp * pp must equal the 8 devices: try dp = 4, tp = 2, pp = 1;")


def test_no_nodes():
    result = check(('nodes    = ["192.168.1.10"]', "nodes    = []"))
    d = only(result, "MSL301")
    assert "0 nodes x 8 = 0" in d.message and "cluster.nodes" in d.hint


def test_bad_per_node_is_not_also_a_tp_error():
    result = check(PER_NODE_4, ('nodes    = ["192.168.1.10"]', 'nodes    = ["10.0.0.1", "10.0.0.2"]'),
                   ("per_node = 4", "per_node = 3"))  # fmt: skip
    assert "MSL303" not in codes(result) and "MSL302" in codes(result)


def test_tp_equal_to_per_node_is_fine():
    two_per_node = (
        ("per_node = 8", "per_node = 2"),
        (
            'nodes    = ["192.168.1.10"]',
            'nodes    = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]',
        ),
    )
    assert codes(check(*two_per_node)) == []


def test_two_nodes_with_device_ip_lists():
    lists = "[[" + ", ".join(f'"192.98.1{i}.1"' for i in range(4)) + "], ["
    lists += ", ".join(f'"192.98.1{i}.2"' for i in range(4)) + "]]"
    assert codes(check(PER_NODE_4, device_ips(lists))) == []


def test_two_nodes_with_hccn_files(tmp_path):
    files = {"a.conf": hccn(1, 4), "b.conf": hccn(2, 4)}
    result = check(
        PER_NODE_4, device_ips('[hccn("a.conf"), hccn("b.conf")]'), files=files, tmp=tmp_path
    )
    assert codes(result) == []
    assert result.spec.cluster.device_ip_files == ("a.conf", "b.conf")


def test_device_ips_need_one_entry_per_node():
    d = only(check(PER_NODE_4, device_ips("[]")), "MSL308")
    assert d.message == "device_ips has 0 entries, but the cluster has 2 nodes"


def test_device_ip_spans_point_at_each_string():
    lists = '[["192.98.10.1", "192.98.11.1", "192.98.12.1", "192.98.13.1"], '
    lists += '["192.98.10.2", "192.98.11.2", "192.98.12.2", "bad"]]'
    d = only(check(PER_NODE_4, device_ips(lists)), "MSL306")
    assert "(node 1 `192.168.1.11`, device 3)" in d.message
    line = BASE.splitlines().index('    nodes    = ["192.168.1.10"]') + 2
    source = edit(PER_NODE_4, device_ips(lists)).splitlines()[line - 1]
    assert source[d.span.col - 1 : d.span.end_col - 1] == '"bad"'


def test_duplicate_device_ip_across_nodes_is_reported_once_per_node():
    lists = '[["192.98.10.1", "192.98.11.1", "192.98.12.1", "192.98.13.1"], '
    lists += '["192.98.10.1", "192.98.11.1", "192.98.12.2", "192.98.13.2"]]'
    d = only(check(PER_NODE_4, device_ips(lists)), "MSL307")
    assert d.message.endswith("already used by node 0, device 0; 1 more of this node's device "
                              "IPs repeat earlier ones")  # fmt: skip


def test_node_written_two_ways_is_one_node():
    result = check(
        PER_NODE_4, ('nodes    = ["192.168.1.10"]', 'nodes    = ["10.0.0.1", "10.0.0.1"]')
    )
    assert codes(result) == ["MSL305"]


def test_master_port():
    ok = (NODES[0] + "\n", NODES[0] + "\n    master_port = 65535\n")
    assert codes(check(ok)) == []
    bad = (NODES[0] + "\n", NODES[0] + "\n    master_port = 65536\n")
    assert codes(check(bad)) == ["MSL316"]


# pipeline ---------------------------------------------------------------------------

PIPE = ("    micro_batches = 4\n",)


def pipe(extra: str) -> tuple[str, str]:
    return (PIPE[0], PIPE[0] + extra)


def test_explicit_split():
    assert codes(check(pipe("    split = [1, 1]\n"))) == []


def test_split_with_one_stage():
    one_stage = ("    dp = 2\n    tp = 2\n    pp = 2\n", "    dp = 4\n    tp = 2\n    pp = 1\n")
    batch = ("global_batch = 8", "global_batch = 16")
    assert codes(check(one_stage, batch, pipe("    split = [2]\n"))) == []


def test_negative_split_entry_is_an_empty_stage():
    d = only(check(pipe("    split = [3, -1]\n")), "MSL312")
    assert d.message == "stage 1 gets -1 layers in split = [3, -1]"


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "interleaved(chunks = 1)"])
def test_schedules(schedule):
    assert codes(check(pipe(f"    schedule = {schedule}\n"))) == []


def test_interleaved_with_split_is_not_checked_for_divisibility():
    layers = ("repeat decoder(emb) layers", "repeat decoder(emb) 5")
    extra = "    schedule = interleaved(chunks = 2)\n    split = [3, 2]\n"
    assert codes(check(layers, pipe(extra))) == []


def test_interleaved_split_gives_every_chunk_a_layer():
    """With `split`, each stage's layers are divided over its chunks: a stage with
    fewer layers than chunks would leave a virtual stage empty."""
    layers = ("repeat decoder(emb) layers", "repeat decoder(emb) 5")
    extra = "    schedule = interleaved(chunks = 2)\n    split = [4, 1]\n"
    d = only(check(layers, pipe(extra)), "MSL315")
    assert "stage 1 gets 1 in split = [4, 1]" in d.message
    assert d.hint == "give every stage at least 2 layers, or use fewer chunks"


def test_interleaved_divisible():
    layers = ("repeat decoder(emb) layers", "repeat decoder(emb) 8")
    assert codes(check(layers, pipe("    schedule = interleaved(chunks = 2)\n"))) == []
    d = only(check(layers, pipe("    schedule = interleaved(chunks = 3)\n")), "MSL315")
    assert d.hint == "use chunks = 1 or 2 or 4, or give `split`"


def test_network_without_repeats_cannot_pipeline():
    no_layers = (
        "    body   = repeat decoder(emb) layers\n    norm   = layernorm(body)",
        "    norm   = layernorm(emb)",
    )
    result = check(no_layers)
    assert "MSL312" in codes(result)
    d = next(d for d in result.diagnostics if d.code == "MSL312")
    assert "repeats no layers" in d.message


def test_pipeline_layers_are_the_repeat_counts_not_the_layers_dim():
    """`layers` is only a dim; the stages split what the network repeats."""
    counts = ("repeat decoder(emb) layers", "repeat decoder(emb) 6")
    assert codes(check(counts, pipe("    split = [4, 2]\n"))) == []
    assert codes(check(counts, pipe("    split = [1, 1]\n"))) == ["MSL311"]


def test_micro_batches_derived_from_the_batch():
    no_pipeline = ("pipeline {\n    micro_batches = 4\n}\n\n", "")
    assert codes(check(no_pipeline)) == []  # 8 / (1 * 2) = 4 >= pp


def test_a_million_layers_check_as_fast_as_two():
    million = ("repeat decoder(emb) layers", "repeat decoder(emb) 1000000")
    groups = (
        '["*.ln*", "*.bias"]',
        '["decoder.999999.qkv.*", "decoder.1000000.*", "decoder.12345?.up.weight"]',
    )
    start = time.perf_counter()
    result = check(million, groups)
    assert time.perf_counter() - start < 5
    unmatched = [d.message for d in result.diagnostics if d.code == "MSL507"]
    assert len(unmatched) == 1 and '"decoder.1000000.*"' in unmatched[0]
    assert not any(d.is_error for d in result.diagnostics if d.code != "MSL401")


# train ------------------------------------------------------------------------------

OPT = "adamw(lr = 1e-3, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1)"
SCHED = "cosine(warmup = 10, steps = 200, min_lr = 1e-4)"
LAST = "    schedule     = " + SCHED + "\n"


def train_line(line: str) -> tuple[str, str]:
    return (LAST, LAST + line + "\n")


@pytest.mark.parametrize(
    "old, new",
    [
        (SCHED, "constant(warmup = 10)"),
        (SCHED, "constant"),
        (SCHED, "cosine(steps = 200)"),
        (SCHED, "cosine(warmup = 0, steps = 2e5, min_lr = 0)"),
        (SCHED, "cosine(warmup = 10, steps = 200, min_lr = 1e-3)"),  # min_lr == lr
        (OPT, "adamw(lr = 3e-4)"),
        (OPT, "adamw(lr = 1e-3, beta1 = 0, beta2 = 0.999, eps = 1, weight_decay = 0)"),
    ],
)
def test_accepted_optimizers_and_schedules(old, new):
    assert codes(check((old, new))) == []


@pytest.mark.parametrize(
    "old, new, code, message",
    [
        (OPT, "adamw", "MSL504", "adamw needs `lr`"),
        (OPT, "adamw(lr = true)", "MSL108", "`lr` of adamw must be a number, got `true`"),
        (OPT, "adamw(lr = fast)", "MSL108", "`lr` of adamw must be a number, got `fast`"),
        (OPT, "adamw(lr = -1e-3)", "MSL505", "lr = -0.001 is out of range: lr must be > 0"),
        (OPT, "adamw(lr = 1e-3, eps = 0)", "MSL505", "eps = 0 is out of range: eps must be > 0"),
        (OPT, "adamw(lr = 1e-3, beta1 = -0.1)", "MSL505",
         "beta1 = -0.1 is out of range: beta1 must be in [0, 1)"),
        (OPT, "sgd(lr = 1e-3)", "MSL504", "unknown optimizer `sgd`"),
        (SCHED, "cosine(warmup = 10, steps = 10.5)", "MSL505",
         "steps = 10.5 is out of range: steps must be a whole number of steps > 0"),
        (SCHED, "cosine(warmup = 300, steps = 200)", "MSL502",
         "warmup = 300 is not shorter than the schedule's steps = 200"),
        (SCHED, "cosine(warmup = 10, steps = 200, min_lr = -1e-5)", "MSL505",
         "min_lr = -1e-05 is out of range: min_lr must be >= 0"),
        (SCHED, "constant(warmup = 10, steps = 200)", "MSL506",
         "constant has no argument `steps`"),
        (SCHED, "constant(warmup = -1)", "MSL505",
         "warmup = -1 is out of range: warmup must be a whole number of steps >= 0"),
    ],
)  # fmt: skip
def test_rejected_optimizers_and_schedules(old, new, code, message):
    d = only(check((old, new)), code)
    assert d.message == message


def test_min_lr_is_not_compared_with_an_invalid_lr():
    result = check((OPT, "adamw(lr = 0)"), (SCHED, "cosine(steps = 200, min_lr = 1e-4)"))
    assert codes(result) == ["MSL505"]


def test_optimizer_error_points_at_the_argument():
    d = only(check((OPT, OPT.replace("eps = 1e-8", "eps = 0"))), "MSL505")
    line = edit((OPT, OPT.replace("eps = 1e-8", "eps = 0"))).splitlines()[d.span.line - 1]
    assert line[d.span.col - 1 : d.span.end_col - 1] == "eps = 0"


@pytest.mark.parametrize(
    "line, found",
    [
        ("    zero         = 3", []),
        ("    zero         = -1", ["MSL503"]),
        ("    loss_scale   = 1024", []),
        ("    loss_scale   = dynamic", []),
        ("    loss_scale   = none", []),
        ("    loss_scale   = 0", ["MSL512"]),
        ("    grad_clip    = none", []),
        ("    grad_clip    = 0.5", []),
        ("    grad_clip    = -1", ["MSL512"]),
        ("    seed         = 0", []),
        ("    seed         = -1", ["MSL505"]),
        ("    seed         = 4294967296", ["MSL505"]),
    ],
)
def test_settings(line, found):
    assert codes(check(train_line(line))) == found


@pytest.mark.parametrize(
    "lines, data, valid, eval_every",
    [
        ([], None, None, None),
        (['data = mindrecord("t.mindrecord")'], "t.mindrecord", None, None),
        (['data = mindrecord("t.mindrecord", valid = "v.mindrecord")'], "t.mindrecord",
         "v.mindrecord", 1000),
        (['data = mindrecord("t.mindrecord", valid = "v.mindrecord")', "eval_every = 25"],
         "t.mindrecord", "v.mindrecord", 25),
        (["data = none"], None, None, None),
    ],
)  # fmt: skip
def test_data_line_names_train_and_valid_sets(lines, data, valid, eval_every):
    no_pipeline = ("    pp = 2\n", "    pp = 1\n")  # validation under a pipeline is MSL514
    result = check(
        no_pipeline, PER_NODE_4, (LAST, LAST + "".join(f"    {line}\n" for line in lines))
    )
    assert result.ok, result.diagnostics
    assert (result.spec.train.data, result.spec.train.valid) == (data, valid)
    assert result.spec.train.eval_every == eval_every


@pytest.mark.parametrize(
    "line, code",
    [
        ('data = mindrecord("t.mindrecord", test = "v.mindrecord")', "MSL108"),
        ('data = mindrecord("t.mindrecord", valid = 3)', "MSL108"),
        ('data = mindrecord("t", valid = "v", valid = "w")', "MSL108"),
        ('data = mindrecord(valid = "v")', "MSL108"),
        ("eval_every = 0", "MSL106"),
        ("eval_every = 100", "MSL513"),
    ],
)
def test_bad_data_lines(line, code):
    assert codes(check(train_line(f"    {line}"))) == [code]


def test_global_batch_mismatch_hint_offers_both_fixes():
    d = only(check(("global_batch = 8", "global_batch = 32")), "MSL501")
    assert d.hint == "set global_batch = 8, or micro_batches = 16"
    d = only(check(("global_batch = 8", "global_batch = 7")), "MSL501")
    assert d.hint == "set global_batch = 8"


FUSION = '["*.ln*", "*.bias"]'


@pytest.mark.parametrize(
    "patterns, unmatched",
    [
        ('["emb.table"]', []),
        ('["norm.gamma", "norm.beta"]', []),
        ('["decoder.1.up.bias", "decoder.[01].*"]', []),
        ('["*"]', []),
        ('["decoder.0.ln1.gamma"]', []),
        ('["logits.weight"]', ["logits.weight"]),  # tied to the embedding: no weight
        ('["decoder.2.*"]', ["decoder.2.*"]),  # two copies: 0 and 1
        ('["Decoder.*"]', ["Decoder.*"]),  # case-sensitive, like the plan
        ('["decoder.*.att.*"]', ["decoder.*.att.*"]),  # attention has no parameters
    ],
)
def test_fusion_patterns(patterns, unmatched):
    result = check((FUSION, patterns))
    assert [d.message.split('"')[1] for d in result.diagnostics] == unmatched
    assert all(d.code == "MSL507" and not d.is_error for d in result.diagnostics)


def test_fusion_patterns_are_skipped_when_the_graph_has_errors():
    broken = ("qkv  = linear(ln1, 3 * hidden)", "qkv  = linear(ln1, 2 * hidden)")
    assert codes(check(broken, (FUSION, '["nothing.*"]'))) == ["MSL119"]


def test_buckets_up_to_the_layers():
    group = (FUSION + "\n", FUSION + '\n    allreduce decoder = ["decoder.*"] buckets 2\n')
    assert codes(check(group)) == []


@pytest.mark.parametrize("glob", ["decoder.1?5.*", "decoder.19[5-9].up.bias", "decoder.*9.ln1.*"])
def test_a_glob_matching_a_few_of_many_copies_is_no_warning(glob):
    """The check and the plan read a glob the same way: exactly, over every copy
    (a check that looked at a sample of 200 copies missed decoder.1?5.*)."""
    from msgen.analysis.plan import Plan

    result = check((FUSION, f'["{glob}"]'), ("layers = 2", "layers = 200"))
    assert result.diagnostics == []
    plan = Plan(result.spec, result.facts)
    runs = [r for rep in plan.repeats for r in plan.layer_runs(rep) if r.fusion_id > 1]
    assert runs, glob  # the plan gives the glob's parameters a fusion id of its own


HUGE = 2**40 - 1


@pytest.mark.parametrize(
    "edits",
    [
        (("per_node = 8", f"per_node = {HUGE}"),),
        (("per_node = 8", f"per_node = {HUGE}"), ("    tp = 2\n", "    tp = 3\n")),
        (("    pp = 2\n", f"    pp = {HUGE}\n"), pipe("    split = [1, 1]\n")),
        (("repeat decoder(emb) layers", f"repeat decoder(emb) {HUGE}"),
         pipe("    schedule = interleaved(chunks = 7)\n")),
        (("repeat decoder(emb) layers", f"repeat decoder(emb) {HUGE}"),
         ("    pp = 2\n", f"    pp = {HUGE}\n"), pipe("    split = [1, 2, 3]\n")),
    ],
)  # fmt: skip
def test_huge_numbers_are_checked_quickly(edits):
    """Hints that list options never count up to a dim near 2^40."""
    start = time.perf_counter()
    result = check(*edits)
    assert time.perf_counter() - start < 5
    assert not result.ok
