"""MindSpore's dry run: launch/dryrun.sh, train.py --dryrun, and `msgen doctor --dryrun`
holding the logged peaks against the estimate per stage.

The log lines are in MindSpore 2.10's format. The strings are in the wheel's
lib/plugin/ascend/libmindspore_ascend_res_manager.so (from
plugin/ascend/res_manager/mem_manager/ascend_dynamic_mem_adapter.cc, DevMemStatistics),
and MindSpore's DryRun tutorial (r2.10.0, tutorials/source_en/debug/dryrun.md) shows
them as a GLOG_v=1 log prints them:

    Device MOC memory size: 65536M
    MindSpore Used memory size: 59392M
    MindSpore memory base address: 0xffffe9dc1407
    Used peak memory usage (without fragments): 23716M
    Actual peak memory usage (with fragments): 26244M

The first line of such a message carries MindSpore's log prefix
(`[INFO] DEVICE(pid,tid,python):time [file:line] function] ...`).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from msgen.cli import main
from msgen.doctor.dryrun import MiB, parse_log
from tests.doctor_fakes import VENV_BIN
from tests.emit_fixtures import SPECS, compile_spec

TINY = Path(__file__).resolve().parent.parent / "specs" / "tiny.msl"  # pp = 2, dp * tp = 4
GiB = 2**30


def stats(used_mib: int, actual_mib: int, pid: int = 4021) -> str:
    return (
        f"[INFO] DEVICE({pid},fffd2b7fe0c0,python):2026-12-01-10:00:00.123.456 "
        "[mindspore/ccsrc/plugin/ascend/res_manager/mem_manager/ascend_dynamic_mem_adapter.cc:160] "
        "DevMemStatistics] Ascend Memory Adapter initialize success, Memory Statistics:\n"
        "Device MOC memory size: 65536M\n"
        "MindSpore Used memory size: 59392M\n"
        "MindSpore memory base address: 0xffffe9dc1407\n"
        f"Used peak memory usage (without fragments): {used_mib}M\n"
        f"Actual peak memory usage (with fragments): {actual_mib}M\n"
    )


def test_parse_the_tutorials_lines():
    peak = parse_log("[WARNING] ME(4021:...) noise\n" + stats(23716, 26244) + "step 1 done\n")
    assert (peak.used_bytes, peak.actual_bytes) == (23716 * 2**20, 26244 * 2**20)


def test_the_highest_report_counts_and_a_log_without_lines_is_none():
    assert parse_log(stats(100, 120) + stats(300, 310) + stats(200, 250)).actual_bytes == 310 * MiB
    assert parse_log("Traceback (most recent call last):\n  RuntimeError: oops\n") is None


def estimate_totals() -> tuple[list[int], int]:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["estimate", str(TINY), "--json"]) == 0
    doc = json.loads(out.getvalue())
    return [s["total_bytes"] for s in doc["stages"]], doc["budget_bytes"]


def doctor_dryrun(logdir: Path) -> tuple[int, dict]:
    out = io.StringIO()
    with redirect_stdout(out):
        status = main(["doctor", str(TINY), "--dryrun", str(logdir), "--json"])
    return status, json.loads(out.getvalue())


def test_peaks_beside_the_estimate_with_the_ratio(tmp_path):
    totals, budget = estimate_totals()
    # rank 0 is stage 0's first rank; ranks 4-7 are stage 1's
    (tmp_path / "worker_0.log").write_text(stats(30, 40))
    (tmp_path / "worker_4.log").write_text(stats(50, 64))
    status, doc = doctor_dryrun(tmp_path)
    assert status == 0, doc["checks"]
    assert doc["dryrun"] == [
        {"stage": 0, "rank": 0, "used_bytes": 30 * MiB, "actual_bytes": 40 * MiB,
         "estimate_bytes": totals[0], "ratio": round(40 * MiB / totals[0], 4), "budget_bytes": budget},
        {"stage": 1, "rank": 4, "used_bytes": 50 * MiB, "actual_bytes": 64 * MiB,
         "estimate_bytes": totals[1], "ratio": round(64 * MiB / totals[1], 4), "budget_bytes": budget},
    ]  # fmt: skip


def test_a_stage_over_budget_is_an_error(tmp_path):
    _, budget = estimate_totals()  # 58 GiB: the 910B's 64 less its runtime reserve
    over = budget // MiB + 512
    (tmp_path / "worker_0.log").write_text(stats(30, 40))
    (tmp_path / "worker_4.log").write_text(stats(over - 100, over))
    status, doc = doctor_dryrun(tmp_path)
    assert status == 1
    errors = [c["message"] for c in doc["checks"] if c["status"] == "error"]
    assert len(errors) == 1 and errors[0].startswith("stage 1 (rank 4): the dry run peaks at")


def test_a_missing_stage_and_a_log_without_peaks_are_errors(tmp_path):
    (tmp_path / "worker_0.log").write_text("RuntimeError: Dryrun is not supported on CPU device\n")
    status, doc = doctor_dryrun(tmp_path)
    assert status == 1
    errors = [c["message"] for c in doc["checks"] if c["status"] == "error"]
    assert errors == [
        "worker_0.log has no peak memory lines",
        "stage 0: no log with peaks (rank 0 is its first rank)",
        "stage 1: no log with peaks (rank 4 is its first rank)",
    ]


# Stands in for msrun: records its arguments and, as a worker under GLOG_v=1 would,
# writes LOGDIR/worker_<node_rank>.log with the statistics lines.
FAKE_MSRUN = r"""#!/bin/sh
for arg in "$@"; do echo "$arg"; done >>"$RECORD"
echo "--" >>"$RECORD"
for arg in "$@"; do
    case $arg in
        --log_dir=*) log_dir=${arg#--log_dir=} ;;
        --node_rank=*) rank=${arg#--node_rank=} ;;
    esac
done
[ "$GLOG_v" = 1 ] || exit 3
{
    echo "[INFO] DEVICE(1,2,python):t [ascend_dynamic_mem_adapter.cc:160] DevMemStatistics] Memory Statistics:"
    echo "Used peak memory usage (without fragments): $((100 + rank))M"
    echo "Actual peak memory usage (with fragments): $((200 + rank))M"
} >"$log_dir/worker_$rank.log"
"""


def test_dryrun_sh_runs_one_rank_per_stage_and_doctor_reads_its_logs(tmp_path):
    tree = compile_spec(TINY, tmp_path / "out")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "msrun").write_text(FAKE_MSRUN)
    (bin_dir / "msrun").chmod(0o755)
    record = tmp_path / "record"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "RECORD": str(record),
    }
    done = subprocess.run(
        ["bash", str(tree / "launch" / "dryrun.sh"), "logs", "--steps", "1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    calls = record.read_text().split("--\n")[:-1]
    assert [c.splitlines() for c in calls] == [
        ["--worker_num=8", "--local_worker_num=1", f"--node_rank={r}", "--sim_level=1",
         f"--sim_rank_id={r}", "--log_dir=logs", "--join=True", str(tree / "train.py"),
         "--synthetic", "--dryrun", "--output", "logs/output", "--steps", "1"]
        for r in (0, 4)
    ]  # fmt: skip
    status, doc = doctor_dryrun(tmp_path / "logs")
    assert [(r["rank"], r["actual_bytes"]) for r in doc["dryrun"]] == [
        (0, 200 * MiB),
        (4, 204 * MiB),
    ]
    assert status == 0


def test_dryrun_sh_needs_a_logdir(tmp_path):
    tree = compile_spec(TINY, tmp_path / "out")
    done = subprocess.run(
        ["bash", str(tree / "launch" / "dryrun.sh")], capture_output=True, text=True
    )
    assert done.returncode == 2 and "usage:" in done.stderr


def test_real_msrun_takes_the_flags_and_the_cpu_build_refuses(tmp_path):
    """MindSpore's own msrun accepts dryrun.sh's flags, names the log worker_<rank>.log,
    and its CPU build refuses the dry run (communication/management.py)."""
    tree = compile_spec(SPECS["tiny_dp"], tmp_path / "out")
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", str(tree / "launch" / "dryrun.sh"), str(tmp_path / "logs")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1
    assert f"see {tmp_path / 'logs'}/worker_0.log" in done.stderr
    log = (tmp_path / "logs" / "worker_0.log").read_text()
    assert "Dryrun is not supported on CPU device for a distributed job" in log


@pytest.mark.slow
def test_train_py_dryrun_compiles_runs_one_step_and_writes_nothing(tmp_path):
    tree = compile_spec(SPECS["tiny_dp"], tmp_path / "out")
    done = subprocess.run(
        [sys.executable, "train.py", "--standalone", "--synthetic", "--dryrun", "--output", "o"],
        cwd=tree, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "rank 0: dry run compiled and ran one step" in done.stdout
    assert sorted(p.name for p in (tree / "o" / "rank_0").iterdir()) == []
    shutil.rmtree(tree / "o")
