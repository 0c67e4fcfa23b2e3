"""The checkpoint writers against each other and against SIGKILL, as processes: two
reshards into one folder at once (one is refused, the other's output is whole), and
merge, reshard, from-hf and to-hf killed with `kill -9` in the middle of writing, then
run again (it succeeds, and nothing of the killed run is left beside the output).

The kill is placed by watching the output's folder for the first checkpoint file the
writer puts there (in its scratch, `.<name>.msgen-new-XXXXXXXX`, msgen.ckpt.output)
and killing the process the moment it appears: the kill lands while the writer is
writing, before anything is switched in.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from msgen.hf.tensors import read_header, read_tensor
from tests.test_ckpt_reshard import loaded, msgen
from tests.test_hostile_ckpt import DP8, SPEC, TP4, build_hf, build_runs, listing

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"}
TP2 = ("--set", "mesh.dp=1", "--set", "mesh.tp=2", "--set", "cluster.per_node=2")

# Both processes import msgen, then wait for the same file: they reach the output within
# a millisecond of each other, and a reshard holds it for seconds.
TOGETHER = """
import os, sys, time
from msgen.cli import main
open(sys.argv[2], "w").close()
while not os.path.exists(sys.argv[1]):
    time.sleep(0.001)
sys.exit(main(sys.argv[3:]))
"""


def started_together(*argvs: list, go: Path) -> list[subprocess.CompletedProcess]:
    """`msgen argv` for each argv, let go at the same moment once all are ready."""
    ready = [go.with_name(f"ready{i}") for i in range(len(argvs))]
    procs = [
        subprocess.Popen([sys.executable, "-c", TOGETHER, go, flag, *map(str, argv)],
                         env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for argv, flag in zip(argvs, ready)
    ]  # fmt: skip
    deadline = time.monotonic() + 120
    while not all(flag.exists() for flag in ready):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.01)
    go.write_text("")
    return [
        subprocess.CompletedProcess(p.args, p.wait(timeout=300), *p.communicate()) for p in procs
    ]


def test_two_reshards_into_one_folder_one_refused_the_other_whole(runs, tmp_path):
    _, run, full, _ = runs
    out = tmp_path / "out"
    argv = ["ckpt", "reshard", SPEC, run, "-o", out, *TP4]
    done = started_together(argv, argv, go=tmp_path / "go")
    codes = sorted(d.returncode for d in done)
    assert codes == [0, 2], [(d.returncode, d.stderr) for d in done]
    refused = next(d for d in done if d.returncode == 2).stderr
    assert f"-o {out} is being written by another msgen" in refused, refused
    assert ".out.msgen-lock" in refused
    # the other's output is whole: every rank's file and strategy, merging to the state
    assert sorted(p.name for p in out.iterdir()) == [f"rank_{r}" for r in range(8)]
    for rank in range(8):
        names = sorted(p.name for p in (out / f"rank_{rank}").iterdir())
        assert names == ["step_00000005.ckpt", "strategy.json"]
    code, err = msgen("ckpt", "merge", SPEC, out, "-o", tmp_path / "m.ckpt", *TP4)
    assert code == 0, err
    merged = loaded(tmp_path / "m.ckpt")
    for name, value in full.items():
        np.testing.assert_array_equal(merged[name], value, err_msg=name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["go", "m.ckpt", "out", "ready0", "ready1"]


def killed_mid_write(argv: list, out: Path) -> None:
    """Start `msgen argv` and SIGKILL it the moment a checkpoint file it writes appears
    beside or in `out` (staged or being written)."""
    proc = subprocess.Popen([sys.executable, "-m", "msgen.cli", *map(str, argv)], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    there = set(out.parent.rglob("*"))
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        if any(".ckpt" in p.name and p not in there for p in out.parent.rglob("*")):
            proc.kill()  # SIGKILL: no handler, no cleanup
            proc.wait()
            return
        time.sleep(0.0005)
    proc.kill()
    raise AssertionError(f"exited {proc.wait()} before it could be killed: {proc.stderr.read()}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return build_runs(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    return build_hf(tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="module")
def sliced(hf, tmp_path_factory):
    """from-hf's per-rank slices of the small LLaMA for tp 2 (what to-hf merges first)."""
    folder, spec = hf
    out = tmp_path_factory.mktemp("sliced") / "ranks"
    code, err = msgen("ckpt", "from-hf", spec, folder, "-o", out, *TP2)
    assert code == 0, err
    return out


def check_merge(runs, out: Path) -> None:
    merged = loaded(out)
    for name, value in runs[2].items():
        np.testing.assert_array_equal(merged[name], value, err_msg=name)


def check_reshard(runs, out: Path) -> None:
    assert sorted(p.name for p in out.iterdir()) == [f"rank_{r}" for r in range(8)]
    state = loaded(out / "rank_2" / "step_00000005.ckpt")
    np.testing.assert_array_equal(state["emb.table"], np.split(runs[2]["emb.table"], 4)[2])


def check_from_hf(hf, out: Path) -> None:
    assert sorted(p.name for p in out.iterdir()) == ["rank_0", "rank_1", "source.json"]
    for rank in (0, 1):
        names = sorted(p.name for p in (out / f"rank_{rank}").iterdir())
        assert names == ["model.ckpt", "strategy.json"]
        assert "emb.table" in loaded(out / f"rank_{rank}" / "model.ckpt")


def check_to_hf(hf, out: Path) -> None:
    source = hf[0] / "model.safetensors"
    for name in read_header(source)[0]:
        np.testing.assert_array_equal(read_tensor(source, name)[0],
                                      read_tensor(out / "model.safetensors", name)[0])  # fmt: skip


KILLS = {"merge": check_merge, "reshard": check_reshard, "from-hf": check_from_hf,
         "to-hf": check_to_hf}  # fmt: skip


# from-hf runs in the quick suite (its kill is the fastest); the others are slow ones
@pytest.mark.parametrize(
    "command",
    ["from-hf", *(pytest.param(c, marks=pytest.mark.slow) for c in ("merge", "reshard", "to-hf"))],
)
def test_killed_mid_write_then_run_again(request, tmp_path, command):
    """Killed by SIGKILL while its scratch fills: the output is as it was (absent, or
    for reshard --force the previous output, byte for byte); run again it succeeds and
    nothing of the killed run remains beside it (its scratch, its lock file)."""
    check = KILLS[command]
    out = tmp_path / "o" / ("m.ckpt" if command == "merge" else "out")
    ran = request.getfixturevalue("runs") if command in ("merge", "reshard") else None
    made = None if ran else request.getfixturevalue("hf")
    argv = {
        "merge": lambda: ["ckpt", "merge", SPEC, ran[1]],
        "reshard": lambda: ["ckpt", "reshard", SPEC, ran[1], "--force", *TP4],
        "from-hf": lambda: ["ckpt", "from-hf", made[1], made[0], *TP2],
        "to-hf": lambda: ["ckpt", "to-hf", made[1], request.getfixturevalue("sliced"), *TP2],
    }[command]() + ["-o", out]
    before = None
    if command == "reshard":  # an output there already, which --force replaces
        assert msgen("ckpt", "reshard", SPEC, ran[1], "-o", out, *DP8)[0] == 0
        before = listing(out)
    out.parent.mkdir(exist_ok=True)
    killed_mid_write(argv, out)
    assert (listing(out) if out.exists() else None) == before
    assert [p for p in out.parent.iterdir() if p != out]  # what it had written so far
    code, err = msgen(*argv)
    assert code == 0, err
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]
    check(ran or made, out)
