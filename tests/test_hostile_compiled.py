"""A tree compiled with `--set` remembers how it was compiled, and what reads the tree
uses the compiled values: compile records the flags (manifest.json, plan.json, a
comment atop train.py), `--check` takes the same flags, the launch scripts' doctor
step and `msgen report` see the compiled device count; doctor's checkpoint space is
exact with a compiled tree and only a warning without one; report says when the run
computed on another kind of device than the spec's; README's Hugging Face example
runs train.py from its tree, where the spec's data paths resolve.

The spec is tests/specs/tiny_dp.msl on one device (dp = 1, no data: --synthetic), so
that `--set cluster.per_node=2` changes the device count from 1 to 2 (dp 1 → 2).
"""

from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import subprocess
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from msgen.cli import main
from tests.doctor_fakes import TINY, VENV_BIN, FakeHost, free_port
from tests.readme_sections import section_commands
from tests.test_hostile_data import tmpfs

ROOT = Path(__file__).resolve().parents[1]
SET = ("--set", "cluster.per_node=2")
ONE_DEVICE = (
    ("model tiny_dp", "model one"),
    ("per_node = 2", "per_node = 1"),
    ("dp = 2\n", "dp = 1\n"),
    ("micro_batches = 2", "micro_batches = 4"),  # the global batch 8 = 2 x dp 1 x 4
    ('    data         = mindrecord("train.mindrecord", valid = "valid.mindrecord")\n', ""),
    ("    eval_every   = 2\n", ""),
)


def env(**extra: str) -> dict[str, str]:
    """msgen (this checkout), python and msrun of this environment first on PATH."""
    path = os.pathsep.join([VENV_BIN, os.environ["PATH"]])
    out = {**os.environ, "PATH": path, "PYTHONPATH": str(ROOT), **extra}
    for leaked in ("MSGEN_SKIP_DOCTOR", "MSGEN_SPEC", "MASTER_ADDR", "RANK_ID"):
        out.pop(leaked, None)
    return out


def msgen(*args: str, cwd: Path) -> tuple[int, str, str]:
    """`msgen ARGS` run from `cwd`, in this process: (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    here = Path.cwd()
    os.chdir(cwd)
    try:
        with redirect_stdout(out), redirect_stderr(err):
            status = main(list(args))
    finally:
        os.chdir(here)
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> Path:
    """A project folder holding specs/one.msl, compiled as the README compiles:
    `msgen compile specs/one.msl -o generated/ --set cluster.per_node=2`."""
    root = tmp_path_factory.mktemp("project")
    text = (ROOT / "tests" / "specs" / "tiny_dp.msl").read_text()
    for old, new in ONE_DEVICE:
        assert old in text, old
        text = text.replace(old, new)
    (root / "specs").mkdir()
    (root / "specs" / "one.msl").write_text(text)
    status, _, err = msgen("compile", "specs/one.msl", "-o", "generated/", *SET, cwd=root)
    assert status == 0, err
    (root / "compile.err").write_text(err)
    return root


@pytest.fixture
def project(compiled, tmp_path) -> Path:
    """A copy of the compiled project this test may write in."""
    shutil.copytree(compiled, tmp_path / "project")
    return tmp_path / "project"


def test_the_tree_records_the_flags_it_was_compiled_with(project):
    tree = project / "generated" / "one"
    manifest = json.loads((tree / "manifest.json").read_text())
    plan = json.loads((tree / "plan.json").read_text())
    assert manifest["set"] == plan["set"] == ["cluster.per_node=2"]
    assert (plan["devices"], plan["mesh"]["dp"]) == (2, 2)
    head = (tree / "train.py").read_text().splitlines()[:5]
    assert head[2].startswith("# Compiled with these --set flags")
    assert head[4] == "#   --set cluster.per_node=2"
    assert "#   --set cluster.per_node=2" in (tree / "launch" / "msrun.sh").read_text()


def test_a_set_that_changes_the_devices_does_not_say_it_keeps_them(project):
    said = (project / "compile.err").read_text()
    assert "keeps the devices" not in said
    assert "note: --set keeps the global batch (devices 1 → 2): dp 1 → 2" in said


def test_check_takes_the_flags_the_tree_was_compiled_with(project):
    """--check is the compile it stands for, without writing: the same flags pass; the
    bare command would rewrite the tree, so it is stale, and the hint names the flags."""
    status, out, err = msgen("compile", "specs/one.msl", "-o", "generated/", "--check", *SET,
                             cwd=project)  # fmt: skip
    assert status == 0, out[-2000:] + err
    status, _, err = msgen("compile", "specs/one.msl", "-o", "generated/", "--check", cwd=project)
    assert status == 3
    assert (
        "hint: generated/one was compiled with --set cluster.per_node=2; this check has no "
        "--set" in err
    )


FAKE_MSRUN = '#!/bin/sh\nfor arg in "$@"; do echo "$arg"; done > "$RECORD"\n'


def test_the_launch_scripts_doctor_sees_the_compiled_devices(project, tmp_path):
    """launch/msrun.sh 0 from the project folder, as the README runs it, with the real
    msgen and a stand-in msrun: its doctor step checks the host for the 2 devices msrun
    is told to start, not the spec's 1."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "msrun").write_text(FAKE_MSRUN)
    (bin_dir / "msrun").chmod(0o755)
    record = tmp_path / "msrun.args"
    run_env = env(MASTER_PORT=str(free_port()), RECORD=str(record))
    run_env["PATH"] = os.pathsep.join([str(bin_dir), run_env["PATH"]])
    done = subprocess.run(
        ["bash", "generated/one/launch/msrun.sh", "0"], cwd=project, env=run_env,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    title = (
        "msgen doctor: specs/one.msl with --set cluster.per_node=2, node 0 (127.0.0.1), 2 devices"
    )
    assert title in done.stdout
    assert "--worker_num=2" in record.read_text().splitlines()


def test_doctor_sizes_the_checkpoint_from_the_tree_it_is_given(project):
    """doctor --tree (as the scripts call it) reads the flags and plan.json of the tree:
    2 devices, and the disk line is of exact checkpoints (2 ranks of the whole model,
    data parallel: 2 x 1.36 MiB, keep 3), not a bound."""
    _, out, _ = msgen("doctor", "specs/one.msl", "--tree", "generated/one", "--json",
                      "--output", "out", cwd=project)  # fmt: skip
    doc = json.loads(out)
    assert (doc["devices"], doc["set"]) == (2, ["cluster.per_node=2"])
    (disk,) = [c for c in doc["checks"] if c["topic"] == "disk"]
    assert "3 checkpoint(s) of 2.7 MiB" in disk["message"] and "at most" not in disk["message"]


def run_folder(project: Path, device_target: str) -> Path:
    """A run of the compiled tree as train.py leaves it: two ranks, each a log.csv and
    a run.json whose spec names the spec, its sha256 and the tree's --set flags (read
    from the manifest, as train.py's write_run_json does), and the device it ran on.
    The slow test below has train.py write them itself."""
    manifest = json.loads((project / "generated" / "one" / "manifest.json").read_text())
    run = project / "output"
    for rank in (0, 1):
        folder = run / f"rank_{rank}"
        folder.mkdir(parents=True)
        (folder / "log.csv").write_text(
            "step,loss,perplexity,lr,grad_norm,loss_scale,skipped,tokens_per_s,step_time,mfu,"
            "valid_loss,valid_perplexity\n"
            + "".join(f"{s},5.5,245,0.001,1.0,65536,0,900,0.28,0.0001,,\n" for s in (1, 2, 3))
        )
        segment = {
            "started": "2026-01-01T00:00:00+00:00", "start_step": 0, "rank": rank,
            "world": 2, "host": "h", "device_target": device_target, "argv": ["train.py"],
            "spec": {"name": "one", "path": manifest["spec"],
                     "sha256": manifest["spec_sha256"], "set": manifest["set"]},
            "tokens_per_step": 256, "mesh": {"dp": 2, "tp": 1, "pp": 1},
        }  # fmt: skip
        (folder / "run.json").write_text(json.dumps({"segments": [segment]}))
    return run


def test_report_holds_the_run_against_the_compiled_plan(project):
    run_folder(project, "Ascend")
    predicted = json.loads(msgen("report", "output", "--json", cwd=project)[1])["predicted"]
    assert (predicted["devices"], predicted["set"]) == (2, ["cluster.per_node=2"])
    assert not [n for n in predicted["notes"] if "the run had" in n], predicted["notes"]
    assert (predicted["run_device"], predicted["same_device"]) == ("Ascend", True)


def test_report_says_a_cpu_run_is_held_against_an_ascend_prediction(project):
    run_folder(project, "CPU")
    text = msgen("report", "output", cwd=project)[1]
    assert (
        "note: the run ran on CPU, the prediction is for ascend910b (Ascend): the ratios "
        "below compare different devices" in text
    )
    doc = json.loads(msgen("report", "output", "--json", cwd=project)[1])["predicted"]
    assert (doc["run_device"], doc["same_device"]) == ("CPU", False)


def test_a_disk_between_the_real_need_and_the_bound_does_not_stop_the_launch(tmp_path):
    """specs/tiny (dp 2, tp 2, pp 2, zero 1; keep 2) on a 5 MiB disk: its 8 ranks'
    checkpoints take 2 x 2.05 MiB as the compiled tree lays them out (2,149,776 B, the
    scalar state's names included, printed 2.1), the estimate's
    bound 2 x 2.8 MiB (it counts each ZeRO-sharded weight's gathered copy and fp32
    moments). With the committed tree the disk is ok; without a tree a warning says the
    size is a bound; neither is the error that stopped the launch scripts."""
    small = tmp_path / "small"
    if not tmpfs(small, "5m"):
        pytest.skip("needs a small file system: root, to mount a tmpfs")
    try:
        (tmp_path / "host").mkdir()
        host = FakeHost(tmp_path / "host")
        _, exact = host.doctor(TINY, output=small / "out", tree=ROOT / "generated" / "tiny")
        _, bound = host.doctor(TINY, output=small / "out", tree=tmp_path / "none")
    finally:
        subprocess.run(["umount", str(small)], check=True)
    (disk,) = [c for c in exact["checks"] if c["topic"] == "disk"]
    assert disk["status"] == "ok" and "2 checkpoint(s) of 2.1 MiB" in disk["message"], disk
    (disk,) = [c for c in bound["checks"] if c["topic"] == "disk"]
    assert disk["status"] == "warning" and "take at most 5.6 MiB" in disk["message"], disk


def test_the_readme_runs_train_py_from_its_tree(tmp_path):
    """The train.py line of README's "Start from a Hugging Face model", run as printed
    by bash with a stand-in python that records where it runs: in the tree's folder,
    where the spec's data paths resolve (docs/language.md), with --init-from and
    --output naming the folders the section's other commands write and read."""
    (line,) = [c for c in section_commands("Start from a Hugging Face model") if "train.py" in c]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text('#!/bin/sh\npwd > "$RECORD"\nfor a in "$@"; do echo "$a"; done >> "$RECORD"\n')  # fmt: skip
    (bin_dir / "python").chmod(0o755)
    (tmp_path / "out" / "my_llama").mkdir(parents=True)
    record = tmp_path / "python.args"
    path = os.pathsep.join([str(bin_dir), os.environ["PATH"]])
    done = subprocess.run(["bash", "-c", line], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PATH": path, "RECORD": str(record)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    cwd, script, *args = record.read_text().splitlines()
    here = Path(cwd)
    assert here.resolve() == (tmp_path / "out" / "my_llama").resolve()
    assert (here / script).resolve() == (here / "train.py").resolve()
    given = dict(zip(args, args[1:], strict=False))
    assert (here / given["--init-from"]).resolve() == (tmp_path / "init").resolve()
    assert (here / given["--output"]).resolve() == (tmp_path / "run").resolve()
    assert shlex.split(line)  # one line a shell reads


@pytest.mark.slow
def test_a_set_compile_launched_with_msrun_sh(project):
    """The issue's case end to end: the tree compiled with --set cluster.per_node=2
    launched with its launch/msrun.sh (real msrun, two CPU processes, data parallel),
    its doctor step, then `msgen report` on the run: both see 2 devices. Each rank's
    checkpoint is the size doctor counts for it (from above, within MindSpore's
    framing), and the report says the CPU run is held against an Ascend prediction."""
    from msgen.doctor.storage import stage_checkpoint_bytes

    done = subprocess.run(
        ["bash", "generated/one/launch/msrun.sh", "0", "--synthetic", "--steps", "2",
         "--output", "output"],
        cwd=project, env=env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), GLOG_v="3"),
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    logs = "".join(p.read_text()[-2000:] for p in (project / "output" / "msrun_log").glob("*"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:] + logs
    assert "specs/one.msl with --set cluster.per_node=2, node 0 (127.0.0.1), 2 devices" in (
        done.stdout
    )
    status, out, err = msgen("report", "output", "--json", cwd=project)
    assert status == 0, err[-2000:]
    report = json.loads(out)
    assert report["world"] == 2
    predicted = report["predicted"]
    assert (predicted["devices"], predicted["set"]) == (2, ["cluster.per_node=2"])
    assert not [n for n in predicted["notes"] if "the run had" in n], predicted["notes"]
    assert (predicted["run_device"], predicted["same_device"]) == ("CPU", False)
    plan = json.loads((project / "generated" / "one" / "plan.json").read_text())
    (counted,) = stage_checkpoint_bytes(plan, semi_auto=False)
    for rank in (0, 1):
        written = (project / "output" / f"rank_{rank}" / "step_00000002.ckpt").stat().st_size
        assert written <= counted <= written * 1.01, (rank, written, counted)
    shutil.rmtree(project / "output")
