"""Rough edges a new user hits, each pinned by a test: what-ifs as the docs print
them, `--set` typos, budgets the device cannot give, labels of specs with one base
name, the summary `check` prints on a terminal, `explain --list`, `--help`, and
`compile` refusing to overwrite what it should not."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from msgen.base.status import EXIT_ERRORS
from msgen.cli import main

ROOT = Path(__file__).resolve().parent.parent
GPT7B = str(ROOT / "specs" / "gpt7b.msl")


def test_a_budget_beyond_the_device_fails_the_estimate_with_both_numbers(capsys):
    # gpt7b's 58 GiB budget on a 32 GiB ascend910a (3 GiB runtime reserve)
    code = main(["estimate", GPT7B, "--set", "cluster.device=ascend910a"])
    err = capsys.readouterr().err
    assert code == EXIT_ERRORS
    assert re.search(
        r"error\[MSL403\]: the budget of 58\.00 GiB .* ascend910a can give: 29\.00 GiB", err
    )


def run_on_a_terminal(args: list[str]) -> tuple[int, str]:
    """`msgen ARGS` with its standard output on a pseudo-terminal, as at a shell."""
    import os
    import pty
    import subprocess
    import sys

    leader, follower = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "msgen.cli", *args],
        cwd=ROOT,
        env=env,
        stdout=follower,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal's other end is closed: everything is read
            break
        if not chunk:
            break
        out += chunk
    os.close(leader)
    return proc.returncode, out.decode().replace("\r\n", "\n")


def test_check_sums_up_on_a_terminal_and_stays_silent_in_a_pipe(capsys):
    specs = ["specs/gpt7b.msl", "specs/tiny.msl", "specs/llama13b.msl"]
    code, out = run_on_a_terminal(["check", *specs])
    assert (code, out) == (0, "3 specs, no errors\n")
    code, out = run_on_a_terminal(["check", "tests/cases/msl402_little_headroom/spec.msl"])
    assert (code, out) == (0, "1 spec, no errors, 2 warnings\n")
    code, out = run_on_a_terminal(["check", "--error-format", "json", *specs])
    assert (code, out) == (0, "")
    # standard output not a terminal (captured): nothing
    assert main(["check", *(str(ROOT / s) for s in specs)]) == 0
    assert capsys.readouterr().out == ""


def test_explain_lists_every_code():
    from msgen.codes import CODES

    code, out = run_on_a_terminal(["explain", "--list"])
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == list(CODES)
    assert "MSL403  budget beyond the device" in out.splitlines()


def test_every_subcommand_describes_itself_in_its_help(capsys):
    import argparse

    import pytest

    from msgen.cli import build_parser

    (sub,) = (a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) >= {"check", "estimate", "plan", "compile", "fmt", "explain", "data"}
    for name in sub.choices:
        with pytest.raises(SystemExit):
            main([name, "--help"])
        out = capsys.readouterr().out
        usage, description = out.split("\n\n")[:2]
        assert usage.startswith(f"usage: msgen {name}")
        assert description and not description.startswith(("positional", "options")), name


def run(*args: str) -> tuple[int, str, str]:
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def test_a_what_if_keeps_devices_and_global_batch_and_says_what_it_rederived():
    code, out, err = run("estimate", GPT7B, "--set", "mesh.tp=4")
    assert code == 0, err
    assert (
        "note: --set keeps the devices and the global batch: dp 4 → 2, micro_batches 64 → 128"
        in err
    )
    assert "on 8 x ascend910b, dp 2 x tp 4 x pp 1" in out
    assert "128 micro-batches per step" in out
    # the same as giving every value
    given = run("estimate", GPT7B, "--set", "mesh.dp=2", "--set", "mesh.tp=4",
                "--set", "pipeline.micro_batches=128")  # fmt: skip
    assert given[0] == 0 and given[2] == ""
    assert (
        given[1].replace(" --set mesh.dp=2", "").replace(" --set pipeline.micro_batches=128", "")
        == out
    )


def test_a_list_of_sets_means_the_same_in_any_order():
    from itertools import permutations

    flags = ["mesh.pp=2", "mesh.tp=1", "train.micro_batch=2"]
    seen = set()
    for order in permutations(flags):
        code, out, err = run("estimate", GPT7B, *(a for f in order for a in ("--set", f)))
        assert code in (0, 1), err
        what_if = next(line for line in out.splitlines() if "what-if" in line)
        seen.add((code, out.replace(what_if, ""), err))
    assert len(seen) == 1
    ((code, out, err),) = seen
    # dp = 8 / (1 * 2) stays 4; micro_batches = 256 / (2 * 4)
    assert "dp 4 x tp 1 x pp 2" in out and "32 micro-batches per step" in out
    assert err.endswith(
        "note: --set keeps the devices and the global batch: micro_batches 64 → 32\n"
    )


def test_a_value_given_is_never_rederived():
    # micro_batches given: kept, so global_batch no longer adds up
    code, _, err = run(
        "estimate", GPT7B, "--set", "mesh.tp=4", "--set", "pipeline.micro_batches=64"
    )
    assert code == EXIT_ERRORS
    assert "note:" in err and "micro_batches 64" not in err.split("note:")[1]
    assert (
        "error[MSL501]: global_batch = 256, but micro_batch * dp * micro_batches = 1 * 2 * 64"
        in err
    )
    # one key twice would make the order matter
    code, _, err = run("estimate", GPT7B, "--set", "mesh.tp=4", "--set", "mesh.tp=2")
    assert code == 2 or "error[MSL001]: --set mesh.tp is given twice" in err


def test_a_typo_in_a_model_key_is_an_error_with_did_you_mean():
    code, out, err = run("estimate", GPT7B, "--set", "model.hiden=4096")
    assert code == EXIT_ERRORS and out == ""
    assert "error[MSL104]: --set model.hiden: `model` has no `hiden`" in err
    assert "did you mean `hidden`?" in err
    # a key msgen reads, or a dim the spec defines, is fine
    assert run("estimate", GPT7B, "--set", "model.head_dim=128")[0] == 0
    assert run("estimate", GPT7B, "--set", "model.ffn=8192")[0] == 0


# every command the README and docs show, run as printed ----------------------------

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = re.compile(r"^ {4,}(msgen .*?)(?:\s+# .*)?$", re.MULTILINE)
PLACEHOLDERS = {"F": "estimate.svg", "K": "3"}
# `msgen data` makes a dataset of at least one global batch (gpt7b: 256 windows of
# 2,049 tokens) from a corpus, or with a tokenizer file, that a checkout does not
# hold; tests/test_data.py runs it on a small spec and corpus.
NOT_RUN = {
    "msgen data specs/gpt7b.msl corpus/ --train-tokenizer",
    "msgen data specs/gpt7b.msl corpus/ --train-tokenizer --valid 0.01 -o data/gpt7b/",
    "msgen data specs/gpt7b.msl corpus.jsonl --train-tokenizer --valid 0.01",
    "msgen data specs/gpt7b.msl shards/ --tokenizer gpt2/tokenizer.json --dedup -o data/gpt7b/",
    # `msgen report` reads a training run's output folder, which a checkout does not
    # hold; tests/test_run_report.py runs it on real runs.
    "msgen report output/",
    "msgen report output/ --html report.html",
    "msgen report output/ --json",
    "msgen report output/ --spec specs/gpt7b.msl",
    "msgen report output/ --svg report.svg",
    "msgen report output/ [--spec SPEC] [--html F | --svg F] [--json]",
    # and `msgen calibrate` several runs' folders; tests/test_run_report_calibrate.py
    # makes runs and fits them.
    "msgen calibrate runs/a/ runs/b/ runs/c/ -o calibration.json",
    "msgen calibrate runs/tp2/ runs/tp8/ runs/seq8k/ -o calibration.json",
    "msgen estimate specs/gpt7b.msl --calibration calibration.json",
    # `msgen doctor` checks the host it runs on: this one is not gpt7b's node and has
    # neither its NPUs nor its data, so it rightly exits 1; tests/test_doctor.py runs
    # doctor on every spec here and on fake Ascend hosts.
    "msgen doctor specs/gpt7b.msl",
    "msgen doctor specs/gpt7b.msl [--node N] [--peers]",
    "msgen doctor specs/gpt7b.msl --node 1 --peers",
    "msgen doctor specs/gpt7b.msl --json",
    "msgen doctor specs/gpt7b.msl --dryrun dry/",
    # README's "Start from a Hugging Face model" needs a model's weights, which a
    # checkout does not hold; tests/test_ckpt_hf.py runs the section on a small LLaMA.
    "msgen import hf my-llama/config.json --seq 32 --global-batch 4 -o my_llama.msl",
    "msgen ckpt from-hf my_llama.msl my-llama/ -o init/",
    "msgen compile my_llama.msl -o out/",
    "msgen ckpt to-hf my_llama.msl run/ --from-hf init/ -o my-llama-trained/",
    "msgen ckpt merge my_llama.msl run/ -o merged.ckpt",
    "msgen ckpt reshard my_llama.msl run/ --set cluster.per_node=2 --set mesh.tp=2 -o run-tp2/",
    # and its mixture of experts, run by tests/test_ckpt_hf.py on a small Qwen3-MoE
    "msgen import hf my-moe/config.json --seq 32 --global-batch 4 --devices 4 --per-node 4 -o my_moe.msl",
    "msgen ckpt from-hf my_moe.msl my-moe/ -o moe-init/ --set mesh.dp=2 --set mesh.tp=2 --set mesh.pp=1 --set mesh.ep=2",
    "msgen ckpt merge my_moe.msl moe-init/ -o moe-merged.ckpt --set mesh.dp=2 --set mesh.tp=2 --set mesh.pp=1 --set mesh.ep=2",
}
# What the text next to a command says it prints (stdout + stderr), beyond exit 0.
SAYS = {
    "msgen estimate specs/gpt7b.msl --set mesh.tp=4": [
        "dp 4 → 2, micro_batches 64 → 128",
        "dp 2 x tp 4 x pp 1",
    ],
    "msgen explain MSL203": ["MSL203: "],
    "msgen explain --list": ["MSL203  "],
    "msgen check specs/*.msl": [],
    "msgen compile specs/gpt7b.msl -o generated/": ["generated/gpt7b: "],
    "msgen plan specs/gpt7b.msl --set mesh.tp=4": ["dp 2 x tp 4 x pp 1"],
    "msgen plan specs/gpt7b.msl --set cluster.devices=16": [
        "note: --set keeps the global batch: dp 4 → 8, micro_batches 64 → 32"
    ],
}


def documented_commands() -> list[str]:
    found = []
    for doc in DOCS:
        found += [m[1].strip() for m in COMMAND.finditer(doc.read_text(encoding="utf-8"))]
    return sorted(set(found))


def variants(command: str) -> list[list[str]]:
    """The command without its `[--optional]` parts and with all of them, as argv."""
    import glob
    import shlex

    bare = re.sub(r"\s*\[--[^]]*\]", "", command)
    full = re.sub(r"\[(--[^]]*)\]", r"\1", command)
    out = []
    for text in dict.fromkeys([bare, full]):
        argv = []
        for word in shlex.split(text)[1:]:
            word = PLACEHOLDERS.get(word, word)
            argv += sorted(glob.glob(word)) if "*" in word else [word]
        out.append(argv)
    return out


def test_the_docs_show_commands_and_the_test_knows_what_it_leaves_out():
    commands = documented_commands()
    assert "msgen estimate specs/gpt7b.msl --set mesh.tp=4" in commands
    assert NOT_RUN <= set(commands), NOT_RUN - set(commands)
    assert set(SAYS) <= set(commands), set(SAYS) - set(commands)


def test_every_documented_command_runs_as_printed(tmp_path, monkeypatch):
    import shutil

    shutil.copytree(ROOT / "specs", tmp_path / "specs")
    shutil.copytree(ROOT / "generated", tmp_path / "generated")
    # the Hugging Face models the docs import, as their published config.json
    for folder, config in (("Qwen2-7B", "qwen2_7b"), ("Mistral-7B", "mistral_7b")):
        (tmp_path / folder).mkdir()
        shutil.copy(
            ROOT / "tests" / "hf_configs" / f"{config}.json", tmp_path / folder / "config.json"
        )
    monkeypatch.chdir(tmp_path)
    for command in documented_commands():
        if command in NOT_RUN:
            continue
        for argv in variants(command):
            code, out, err = run(*argv)
            assert code == 0, (command, argv, err[-2000:])
            for text in SAYS.get(command, []):
                assert text in out + err, (command, text, out[-500:], err[-500:])


def test_the_readme_installs_msgen_alone_for_those_who_only_compile():
    import tomllib

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick = readme[readme.index("## Quick start") : readme.index("## Commands")]
    assert "    pip install -e .\n" in quick
    assert "    make demo " in quick and "    make test " in quick
    # what `pip install -e .` brings: no MindSpore (check, estimate, compile never import it)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert not [d for d in project["dependencies"] if d.lower().startswith("mindspore")]


def test_two_specs_with_one_base_name_are_labelled_by_the_path_given(tmp_path, monkeypatch):
    base = (ROOT / "tests" / "cases" / "base.msl").read_text(encoding="utf-8")
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "x.msl").write_text(base.replace("tp = 2\n", "tp = 3\n"))
    monkeypatch.chdir(ROOT)  # both lie outside the current directory
    given = [str(tmp_path / "a" / "x.msl"), str(tmp_path / "b" / "x.msl")]
    code, _, err = run("check", *given)
    assert code == EXIT_ERRORS
    heads = [line for line in err.splitlines() if "error[MSL301]" in line]
    assert [h.split(":")[0] for h in heads] == given


def test_compile_refuses_to_overwrite_a_generated_file_edited_by_hand(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = str(tmp_path / "out")
    assert run("compile", "specs/tiny.msl", "-o", out)[0] == 0
    model = tmp_path / "out" / "tiny" / "model.py"
    edited = model.read_text() + "# a local fix\n"
    model.write_text(edited)
    # a change of the spec would overwrite it: refused, naming the file, nothing written
    code, _, err = run("compile", "specs/tiny.msl", "-o", out, "--set", "model.seq=64")
    assert code == 2
    assert "refusing to overwrite generated files edited by hand in " in err
    assert err.splitlines()[0].endswith("out/tiny: model.py")
    assert model.read_text() == edited
    # an edit the new tree already holds loses nothing; --force overwrites
    assert run("compile", "specs/tiny.msl", "-o", out, "--set", "model.seq=64", "--force")[0] == 0
    assert "# a local fix" not in model.read_text()


def test_compile_refuses_a_second_spec_with_the_same_model_name(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = str(tmp_path / "out")
    assert run("compile", "specs/tiny.msl", "-o", out)[0] == 0
    before = (tmp_path / "out" / "tiny" / "manifest.json").read_text()
    other = tmp_path / "other.msl"
    other.write_text((ROOT / "tests" / "cases" / "base.msl").read_text())  # also `model tiny`
    code, _, err = run("compile", str(other), "-o", out)
    assert code == 2
    assert "it was compiled from specs/tiny.msl, not other.msl" in err
    assert (tmp_path / "out" / "tiny" / "manifest.json").read_text() == before
    # the same spec again is fine
    assert run("compile", "specs/tiny.msl", "-o", out)[0] == 0


# `check` reports every mistake it can find --------------------------------------------

CASES = ROOT / "tests" / "cases"


def combined(*cases: str) -> str:
    """base.msl with the edits of several golden cases (each one mistake) applied
    together; the cases' first-line comments are left out."""
    import difflib

    base = (CASES / "base.msl").read_text(encoding="utf-8").splitlines(keepends=True)
    edits = []
    for case in cases:
        spec = (CASES / case / "spec.msl").read_text(encoding="utf-8").splitlines(keepends=True)
        ops = difflib.SequenceMatcher(a=base, b=spec, autojunk=False).get_opcodes()
        edits += [(i1, i2, spec[j1:j2]) for tag, i1, i2, j1, j2 in ops if tag != "equal" and i1]
    out = list(base)
    for i1, i2, new in sorted(edits, key=lambda e: e[0], reverse=True):
        out[i1:i2] = new
    return "".join(out)


def findings(path: Path) -> set[tuple[str, str]]:
    code, _, err = run("check", "--error-format", "json", str(path))
    import json

    return {(d["code"], d["message"]) for d in map(json.loads, err.splitlines())}


@pytest.mark.parametrize(
    "first, later",
    [
        ("msl101_unknown_dim", "msl301_two_nodes"),  # a model typo; the cluster's own mistake
        ("msl101_unknown_dim", "msl512_negative_loss_scale"),  # ...; a training setting's
        ("msl309_hccn_missing", "msl117_add_shapes_disagree"),  # an unreadable hccn; shapes
        ("msl104_unknown_key", "msl201_tp_does_not_divide_heads"),  # mesh key typo; sharding
        ("msl505_lr_not_positive", "msl303_tp_spans_nodes"),  # train value; topology
    ],
)
def test_check_reports_the_independent_mistakes_of_every_stage(first, later, tmp_path):
    """Each golden case's findings, checked alone, are among those of the spec that
    makes both mistakes: an earlier stage's error hides only what it makes meaningless."""
    import shutil

    for case in (first, later):
        for extra in (CASES / case).glob("*.conf"):
            shutil.copy(extra, tmp_path)
    both = tmp_path / "both.msl"
    both.write_text(combined(first, later), encoding="utf-8")
    alone = findings(CASES / first / "spec.msl") | findings(CASES / later / "spec.msl")
    assert alone <= findings(both), alone - findings(both)


def test_check_says_when_it_stopped_early(tmp_path):
    spec = tmp_path / "s.msl"
    spec.write_text(combined("msl101_unknown_dim"), encoding="utf-8")
    code, _, err = run("check", str(spec))
    assert code == EXIT_ERRORS
    # the model's dims feed every shape and the layer count the pipeline splits
    assert err.endswith(
        "note: stopped early; not checked until the errors above are fixed: names, shapes, "
        "shardings, layouts, pipeline, multi-token prediction, memory budget\n"
    )
    # a syntax error leaves nothing to check; a clean spec, or JSON, gets no note
    spec.write_text(combined("msl002_unclosed_string"), encoding="utf-8")
    assert run("check", str(spec))[2].endswith(
        "not checked until the errors above are fixed: the blocks' values, names, shapes, "
        "shardings, layouts, topology, pipeline, training settings, multi-token prediction, memory budget\n"
    )
    assert "note:" not in run("check", "--error-format", "json", str(spec))[2]
    assert run("check", str(CASES / "base.msl"))[2] == ""


def test_a_value_computed_from_a_broken_dim_is_not_checked(tmp_path):
    """A dim whose definition failed is left out quietly where it is used: a block that
    uses it is not checked (its value is not the one written), so no made-up finding
    such as `global_batch = 1` follows."""
    text = (CASES / "base.msl").read_text(encoding="utf-8")
    text = text.replace("    layers = 2\n", "    layers = 2\n    gb = 16 * hiden\n", 1)
    text = re.sub(r"global_batch\s*=\s*\d+", "global_batch = gb", text)
    spec = tmp_path / "s.msl"
    spec.write_text(text, encoding="utf-8")
    assert findings(spec) == {("MSL101", "unknown dim `hiden`")}
    assert "training settings" in run("check", str(spec))[2].splitlines()[-1]


# the docs a new user reads ----------------------------------------------------------


def test_the_device_catalogue_in_the_docs_is_the_one_msgen_uses():
    """docs/devices.md: a row per device of the catalogue, each figure the one the
    estimate uses, and a source named for every device."""
    from msgen.ir.devices import DEVICES

    text = (ROOT / "docs" / "devices.md").read_text(encoding="utf-8")
    rows = {}
    for line in text.splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0].strip("`")] = cells[1:]
    assert set(rows) == set(DEVICES)

    def number(cell: str) -> float:
        return float(re.search(r"[\d.]+", cell.replace(",", "")).group())

    gib, tera, giga = 2**30, 1e12, 1e9
    for name, d in DEVICES.items():
        hbm, reserve, usable, peak, fp32, bandwidth, intra, inter = rows[name]
        assert number(hbm) * gib == d.hbm_bytes, name
        assert number(reserve) * gib == d.reserve_bytes, name
        assert number(usable) * gib == d.usable_bytes, name
        assert number(peak) * tera == d.peak_flops, name
        assert number(fp32) * tera == d.matmul_flops["fp32"], name
        assert number(bandwidth) * tera == pytest.approx(d.hbm_bandwidth), name
        assert number(intra.split(",")[-1]) * giga == pytest.approx(d.intra.bandwidth), name
        assert ("full mesh" in intra) == d.intra.full_mesh, name
        assert number(inter.split(",")[-1]) * giga == pytest.approx(d.inter.bandwidth), name
        assert f"**{name}**" in text, f"no sources given for {name}"


def test_every_flag_of_train_py_is_in_the_readme():
    """The flags of every committed train.py (what argparse declares), each a row of the
    README's table, and no row for a flag train.py lacks."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = set(re.findall(r"^\| `(--[a-z-]+)", readme, re.MULTILINE))
    for train in sorted((ROOT / "generated").glob("*/train.py")):
        declared = set(re.findall(r'add_argument\(\s*"(--[a-z-]+)"', train.read_text()))
        assert declared and declared == table, (train, declared ^ table)


def llama_parameters(vocab, hidden, heads, kv_heads, ffn, layers) -> int:
    """LLaMA's parameters from its definition (Touvron et al. 2023): per layer q, k, v and
    o projections (k and v of kv_heads heads), gate, up and down, two RMSNorm gains; an
    embedding, a final norm and an untied output layer."""
    head_dim = hidden // heads
    attention = hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + hidden * hidden
    per_layer = attention + 3 * hidden * ffn + 2 * hidden
    return layers * per_layer + 2 * vocab * hidden + hidden


def test_the_llama_example_says_how_many_parameters_it_has(tmp_path):
    from tests.test_docs import examples

    text = (ROOT / "docs" / "language.md").read_text(encoding="utf-8")
    (spec,) = [s for _, s in examples() if "model llama7b" in s]
    path = tmp_path / "llama7b.msl"
    path.write_text(spec, encoding="utf-8")
    code, out, err = run("estimate", str(path), "--json")
    assert code == 0, err
    import json

    counted = json.loads(out)["params_total"]
    assert counted == llama_parameters(32000, 4096, 32, 8, 11008, 32)
    assert f"{counted:,} parameters ({counted / 1e9:.2f} B)" in " ".join(text.split())
    # LLaMA-2-7B, published as 6.74 B (6,738,415,616), is the same with 32 k/v heads
    llama2 = llama_parameters(32000, 4096, 32, 32, 11008, 32)
    assert llama2 == 6_738_415_616 and f"{llama2:,} (6.74 B)" in " ".join(text.split())


def test_the_readme_says_how_long_make_test_takes():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick = readme[readme.index("## Quick start") : readme.index("## Commands")]
    assert re.search(r"`make test` takes about \d+ minutes", quick)


def test_git_ignores_the_data_the_readme_writes():
    import subprocess

    ignored = subprocess.run(["git", "check-ignore", "-q", "data/gpt7b/train.mindrecord"], cwd=ROOT)
    assert ignored.returncode == 0  # what the README's `msgen data ... -o data/gpt7b/` writes
    for source in ("msgen/data/command.py", "tests/data/vimtutor_zh_cn.txt"):
        kept = subprocess.run(["git", "check-ignore", "-q", source], cwd=ROOT)
        assert kept.returncode == 1, source  # msgen's own data package and fixtures


@pytest.mark.parametrize("vocab, code", [(256, EXIT_ERRORS), (512, 0)])
def test_the_readme_vocab_advice_for_train_tokenizer(vocab, code, tmp_path):
    """The tiny specs' 256 is refused with MSL601; 512, the smallest the README
    suggests, trains a tokenizer and packs the data."""
    from tests.data_fixtures import english, write_spec

    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert "`vocab = 256` is refused" in readme and "512 to 4,096 for a small test corpus" in readme
    spec = write_spec(tmp_path / "spec", vocab=vocab)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(english()), encoding="utf-8")
    status, _, err = run("data", str(spec), str(corpus), "--paragraphs", "--train-tokenizer",
                         "-o", str(tmp_path / "data"))  # fmt: skip
    assert status == code, err
    assert ("error[MSL601]" in err) == (vocab == 256)


def test_the_readme_plan_write_gives_a_spec_that_checks_estimates_and_compiles(
    tmp_path, monkeypatch
):
    """`msgen plan specs/gpt7b.msl --write planned.msl`, as the README prints it, from the
    top of a checkout: the spec lands in another folder than the one it came from and
    still reads its hccn.conf, keeps the headroom (no MSL402), and compiles."""
    import shutil

    shutil.copytree(ROOT / "specs", tmp_path / "specs")
    monkeypatch.chdir(tmp_path)
    command = "msgen plan specs/gpt7b.msl --write planned.msl"
    assert command in documented_commands()
    code, _, err = run(*command.split()[1:])
    assert code == 0, err
    assert 'hccn("specs/hccn.conf")' in Path("planned.msl").read_text(encoding="utf-8")
    for argv in (["check"], ["estimate"], ["compile", "-o", "generated/"]):
        code, _, err = run(argv[0], "planned.msl", *argv[1:])
        assert code == 0 and "warning" not in err and "error" not in err, (argv, err)


@pytest.mark.slow
def test_the_readme_path_from_text_to_a_training_run(tmp_path, monkeypatch):
    """README, "From text to a training run", from the top of a checkout, as printed:
    `msgen data SPEC corpus/ --train-tokenizer --valid 0.01 -o data/<model>/`, the line
    it prints last pasted into the spec's `train` block, `msgen compile SPEC -o
    generated/`, and `python train.py --standalone --steps 2` in generated/<model>/ on
    that data (specs/tiny.msl with vocab 512, the smallest the README suggests)."""
    import os
    import shutil
    import subprocess
    import sys

    from tests.data_fixtures import english

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    steps = readme[readme.index("## From text to a training run") :]
    step1 = "msgen data specs/gpt7b.msl corpus/ --train-tokenizer --valid 0.01 -o data/gpt7b/"
    assert step1 in steps and "msgen compile specs/gpt7b.msl -o generated/" in steps
    assert "Put the line it prints last in the spec's `train` block" in steps
    shutil.copytree(ROOT / "specs", tmp_path / "specs")
    monkeypatch.chdir(tmp_path)
    spec = Path("specs/tiny.msl")
    spec.write_text(spec.read_text(encoding="utf-8").replace("vocab  = 256", "vocab  = 512"))
    Path("corpus").mkdir()
    Path("corpus/topics.txt").write_text("\n\n".join(english()), encoding="utf-8")
    argv = step1.replace("gpt7b", "tiny").split()[1:]
    code, out, err = run(*argv, "--paragraphs")  # one document per help topic
    assert code == 0, err
    line = out.strip().splitlines()[-1].strip()  # the data line; the words go to stderr
    # tiny has pp = 2, which evaluates no validation set (MSL514): the line names the
    # train file only, and says so
    assert line.startswith("data = mindrecord(") and "valid = " not in line, line
    text = spec.read_text(encoding="utf-8")
    last = "    seed         = 1234          # no data: only --synthetic runs\n"
    spec.write_text(text.replace(last, last + f"    {line}\n"), encoding="utf-8")
    code, _, err = run("compile", "specs/tiny.msl", "-o", "generated/")
    assert code == 0, err
    proc = subprocess.run(
        [sys.executable, "train.py", "--standalone", "--steps", "2"],
        cwd="generated/tiny",
        env={**os.environ, "GLOG_v": "3"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    log = Path("generated/tiny/output/rank_0/log.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in log[1:]] == ["1", "2"]
