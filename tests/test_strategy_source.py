"""Why the expected strategy files are not compared with ones MindSpore writes on the CPU.

`msgen compile` writes the strategy each rank is expected to have (strategy/stage_<s>.json,
msgen/emit/strategy.py), and tests/test_strategy_merge.py shows MindSpore's own
transform_checkpoints merges a run laid out with them. A field-by-field comparison
with the file MindSpore itself writes needs the parallel pass to run, and the CPU
build runs it in none of the ways there are (each shown here on the installed wheel):

- semi-auto parallel over more than one device stops at graph compile: the parallel
  pass asks for the communication backend and takes only Ascend or GPU
  (GetCommInfo, frontend/parallel/step_parallel_utils.cc);
- msrun's dry run (MS_SIMULATION_LEVEL), which compiles a rank's graph without its
  devices, is refused by init() on the CPU (communication/management.py, `init`);
- AutoParallel without init() takes one device (get_group_size(),
  parallel/auto_parallel.py), compiles, and writes no strategy file;
- and the Ascend target needs CANN's libraries, which a CPU host does not have.

Should a later MindSpore lift one of these, a test here fails, and the comparison can
be written against what it writes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import os, sys
import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops
from mindspore.parallel.auto_parallel import AutoParallel

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
way, path = sys.argv[1], sys.argv[2]


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.w = ms.Parameter(Tensor(np.ones((8, 8), np.float32)), name="w")
        self.mm = ops.MatMul().shard(((1, 1), (1, 2)))

    def construct(self, x):
        return self.mm(x, self.w).sum()


x = Tensor(np.ones((4, 8), np.float32))
try:
    if way == "semi_auto":
        ms.set_auto_parallel_context(
            parallel_mode="semi_auto_parallel", device_num=2, global_rank=0,
            strategy_ckpt_config={"save_file": path, "only_trainable_params": False},
        )
        Net().compile(x)
    else:
        if way == "dry_run":
            from mindspore.communication import init

            init()
        cell = AutoParallel(Net(), parallel_mode="semi_auto")
        cell.save_param_strategy_file(path)
        cell.compile(x)
    print("COMPILED")
except RuntimeError as e:
    print("REFUSED", str(e).splitlines()[0])
"""


def attempt(tmp_path: Path, way: str, **env: str) -> tuple[str, bool]:
    """(the script's verdict line, whether a strategy file was written)."""
    path = tmp_path / "strategy.json"
    script = tmp_path / "attempt.py"  # a file: graph mode reads the cells' source
    script.write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), way, str(path)],
        cwd=tmp_path,
        env={**os.environ, "GLOG_v": "3", **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("COMPILED", "REFUSED"))]
    assert lines, proc.stdout[-2000:] + proc.stderr[-2000:]
    return lines[-1], path.exists()


def test_semi_auto_over_two_devices_stops_at_compile_on_the_cpu(tmp_path):
    verdict, written = attempt(tmp_path, "semi_auto")
    assert verdict.startswith("REFUSED Invalid communication backend: CPU"), verdict
    assert not written


def test_the_dry_run_is_refused_on_the_cpu(tmp_path):
    verdict, written = attempt(
        tmp_path, "dry_run", MS_SIMULATION_LEVEL="1", RANK_SIZE="2", RANK_ID="0"
    )
    assert verdict == "REFUSED Dryrun is not supported on CPU device for a distributed job."
    assert not written


def test_one_device_compiles_and_writes_no_strategy(tmp_path):
    verdict, written = attempt(tmp_path, "one_device")
    assert verdict == "COMPILED"
    assert not written
