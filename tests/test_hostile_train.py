"""The generated train.py on damaged state and bad arguments: each case is one line,
`train.py: error: ...`, exit 2, before the step graph is compiled, and nothing in the
folder changed. Real train.py of tests/specs/tiny_dp.msl (data and valid MindRecord
files), run as a user runs it, on real MindSpore; the cases run side by side.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from tests.emit_fixtures import compiled, load

SEQ, VOCAB, STEP_ROWS = 32, 256, 8  # tiny_dp's
HEADER = (
    "step,loss,perplexity,lr,grad_norm,loss_scale,skipped,tokens_per_s,step_time,mfu,"
    "valid_loss,valid_perplexity\n"
)
# What MindSpore reads to find it was started by a launcher (communication/management.py
# _host_distribute and _check_parallel_envs; comm_helper.py _check_mpi_envs).
LAUNCHER_VARIABLES = (
    "MS_ROLE",
    "MS_WORKER_NUM",
    "MS_SCHED_HOST",
    "OMPI_COMMAND",
    "PMIX_RANK",
    "RANK_TABLE_FILE",
    "MINDSPORE_HCCL_CONFIG_PATH",
    "RANK_ID",
    "RANK_SIZE",
)


def write_mindrecord(path: Path, rows, shape=(-1,)) -> None:
    from mindspore.mindrecord import FileWriter

    writer = FileWriter(str(path), shard_num=1)
    writer.add_schema({"input_ids": {"type": "int32", "shape": list(shape)}}, "tokens")
    writer.write_raw_data([{"input_ids": np.asarray(r, np.int32)} for r in rows])
    writer.commit()


def good_rows(count: int) -> np.ndarray:
    return np.random.default_rng(7).integers(0, VOCAB, (count, SEQ + 1), np.int32)


def replace_train(folder: Path, rows, shape=(-1,)) -> None:
    for name in ("train.mindrecord", "train.mindrecord.db"):
        (folder / name).unlink()
    write_mindrecord(folder / "train.mindrecord", rows, shape)


def with_row(index: int, row) -> list:
    rows = list(good_rows(24))
    rows[index] = np.asarray(row, np.int32)
    return rows


def run_folder(folder: Path, *files: tuple[str, str]) -> None:
    (folder / "output" / "rank_0").mkdir(parents=True)
    for name, text in files:
        (folder / "output" / "rank_0" / name).write_text(text)


def garbage_checkpoint(folder: Path) -> None:
    run_folder(folder, ("step_00000002.ckpt", "not a checkpoint\n"))


def checkpoint_without_step(folder: Path) -> None:
    import mindspore as ms

    run_folder(folder)
    path = folder / "output" / "rank_0" / "step_00000002.ckpt"
    ms.save_checkpoint([{"name": "w", "data": ms.Tensor(np.ones(2, np.float32))}], str(path))


def bad_id(value: int):
    row = good_rows(1)[0]
    row[7] = value
    return lambda folder: replace_train(folder, with_row(5, row))


def nothing(folder: Path) -> None:
    pass


STANDALONE = ("--standalone", "--steps", "2")
# name: (how the folder is damaged, train.py's arguments, what the line says)
CASES = {
    "steps_zero": (nothing, ("--standalone", "--steps", "0"), ["--steps", "0"]),
    "steps_negative": (nothing, ("--standalone", "--steps", "-3"), ["--steps", "-3"]),
    "profile_negative": (nothing, (*STANDALONE, "--profile", "-1"), ["--profile", "-1"]),
    "output_is_a_file": (
        lambda f: (f / "out.txt").write_text("mine\n"),
        (*STANDALONE, "--output", "out.txt"),
        ["out.txt", "not a folder"],
    ),
    "output_is_dev_null": (nothing, (*STANDALONE, "--output", "/dev/null"), ["/dev/null"]),
    "a_run_is_there": (
        lambda f: run_folder(f, ("log.csv", HEADER + "1,5,1,1,1,1,0,1,1,1,,\n")),
        STANDALONE,
        ["already holds a run", "--resume", "--overwrite"],
    ),
    "a_checkpoint_is_there": (
        garbage_checkpoint,
        STANDALONE,
        ["already holds a run", "--resume", "--overwrite"],
    ),
    "resume_with_nothing": (nothing, (*STANDALONE, "--resume"), ["nothing to resume"]),
    "resume_with_only_garbage": (
        garbage_checkpoint,
        (*STANDALONE, "--resume"),
        ["no checkpoint", "step_00000002.ckpt"],
    ),
    "resume_without_step": (
        checkpoint_without_step,
        (*STANDALONE, "--resume"),
        ["no checkpoint", "step_00000002.ckpt", "no step"],
    ),
    "log_with_a_foreign_header": (
        lambda f: (garbage_checkpoint(f), (f / "output/rank_0/log.csv").write_text("a,b\n1,2\n")),
        (*STANDALONE, "--resume"),
        ["log.csv", "header"],
    ),
    "log_with_a_step_that_is_no_number": (
        lambda f: (garbage_checkpoint(f), (f / "output/rank_0/log.csv").write_text(HEADER + "x\n")),
        (*STANDALONE, "--resume"),
        ["log.csv", "line 2", "'x'"],
    ),
    "dataset_json_not_json": (
        lambda f: (f / "dataset.json").write_text("{"),
        STANDALONE,
        ["dataset.json", "not JSON"],
    ),
    "dataset_json_a_list": (
        lambda f: (f / "dataset.json").write_text("[1, 2]"),
        STANDALONE,
        ["dataset.json", "not an object"],
    ),
    "dataset_json_deeply_nested": (
        lambda f: (f / "dataset.json").write_text("[" * 100_000 + "]" * 100_000),
        STANDALONE,
        ["dataset.json"],
    ),
    "dataset_json_vocab_a_string": (
        lambda f: (f / "dataset.json").write_text('{"vocab": "256", "seq": 32}'),
        STANDALONE,
        ['vocab is "256"', "not a whole number"],
    ),
    "id_past_the_vocab": (bad_id(VOCAB), STANDALONE, ["sample 5", "id 256", "vocab 256"]),
    "negative_id": (bad_id(-1), STANDALONE, ["sample 5", "id -1", "vocab 256"]),
    "a_shorter_sample": (
        lambda f: replace_train(f, with_row(3, np.zeros(20))),
        STANDALONE,
        ["sample 3", "20 ids", "seq + 1 is 33"],
    ),
    "a_2d_column": (
        lambda f: replace_train(f, [np.zeros((SEQ + 1, 1))] * 24, shape=(-1, 1)),
        STANDALONE,
        ["input_ids", "2-D"],
    ),
    "outside_a_launcher": (nothing, ("--steps", "2"), ["launch/msrun.sh", "--standalone"]),
}


def snapshot(folder: Path) -> dict[str, bytes | None]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() if p.is_file() else None
        for p in sorted(folder.rglob("*"))
        if "__pycache__" not in p.parts
    }


def base_folder(root: Path) -> Path:
    base = root / "base"
    shutil.copytree(compiled("tiny_dp"), base)
    write_mindrecord(base / "train.mindrecord", good_rows(24))
    write_mindrecord(base / "valid.mindrecord", good_rows(16))
    return base


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    return {**env, "GLOG_v": "3"}


def run_train(folder: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(folder / "train.py"), *args],
        cwd=cwd or folder,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict:
    """Each case's (exit status, stdout, stderr, folder before, folder after)."""
    root = tmp_path_factory.mktemp("hostile_train")
    base = base_folder(root)
    prepared = {}
    for name, (damage, args, _) in CASES.items():
        folder = root / name
        shutil.copytree(base, folder)
        damage(folder)
        prepared[name] = (folder, args, snapshot(folder))

    def run(name):
        folder, args, before = prepared[name]
        proc = run_train(folder, *args)
        return name, (proc.returncode, proc.stdout, proc.stderr, before, snapshot(folder))

    with ThreadPoolExecutor(4) as pool:
        return dict(pool.map(run, CASES))


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_one_line_exit_2_before_compiling(outcomes, name):
    status, out, err, before, after = outcomes[name]
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1, (status, out, err)
    assert lines[0].startswith("train.py: error: "), err
    for part in CASES[name][2]:
        assert part in lines[0], (part, lines[0])
    assert "compiling" not in out, out
    assert after == before  # nothing written, nothing removed


def test_a_missing_data_file_names_where_it_was_looked_for(tmp_path):
    """The data path is relative to where train.py is started: the message says which
    folder that was and the path it made of it."""
    folder = base_folder(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = run_train(folder, *STANDALONE, cwd=elsewhere)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert "train.mindrecord: no such data file" in line
    assert f"resolved from {elsewhere}" in line and str(elsewhere / "train.mindrecord") in line
    assert "msgen data" in line


def test_every_sample_read_is_checked(tmp_path, capsys):
    """A sample past what the check before the run reads still stops the run with one
    line when the reader reaches it, before it reaches the network."""
    train = load(compiled("tiny_dp"), "train")
    path = tmp_path / "train.mindrecord"
    rows = good_rows(40)
    rows[37, 4] = VOCAB + 3
    write_mindrecord(path, rows)
    train.DATA = str(path)
    read = list(train.read_rows(str(path), np.arange(32), STEP_ROWS))
    assert len(read) == 4
    with pytest.raises(SystemExit) as stop:
        list(train.read_rows(str(path), np.arange(40), STEP_ROWS))
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("train.py: error: ") and "sample 37" in line and "id 259" in line


def test_a_save_keeps_the_newest_of_this_run_and_never_what_it_wrote(tmp_path):
    """tiny_dp keeps 3. Files of later steps (a run --resume passed over) are no part of
    this run: they stay, and never push out the checkpoint just written."""
    import mindspore as ms

    train = load(compiled("tiny_dp"), "train")
    assert train.CHECKPOINT_KEEP == 3
    for step in (1, 2, 6, 7, 8):
        (tmp_path / f"step_{step:08d}.ckpt").write_text("not this step's\n")
    state = {"w": ms.Parameter(ms.Tensor(np.ones(2, np.float32)), name="w")}
    train.save(tmp_path, 3, state)
    train.save(tmp_path, 4, state)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"step_{step:08d}.ckpt" for step in (2, 3, 4, 6, 7, 8)
    ]
    saved = ms.load_checkpoint(str(tmp_path / "step_00000004.ckpt"))
    assert int(saved["step"].asnumpy()) == 4
    np.testing.assert_array_equal(saved["w"].asnumpy(), np.ones(2, np.float32))


def test_a_sample_of_another_length_read_later_is_one_line(tmp_path, capsys):
    """Past the samples checked before the run, a sample of another length makes
    MindSpore's batching fail: one line naming the file and where in it."""
    train = load(compiled("tiny_dp"), "train")
    path = tmp_path / "train.mindrecord"
    write_mindrecord(path, [*good_rows(12), np.zeros(SEQ), *good_rows(3)])
    with pytest.raises(SystemExit) as stop:
        list(train.read_rows(str(path), np.arange(16), STEP_ROWS))
    assert stop.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("train.py: error: ")
    # MindSpore reads ahead: the line names a sample at or before the bad one (12)
    (start,) = re.findall(r"from sample (\d+) on", line)
    assert int(start) <= 12 and "train.mindrecord" in line
