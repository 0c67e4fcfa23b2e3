"""From raw text to a falling loss: `msgen data` trains a tokenizer on text nobody here
wrote (CPython's help topics and the Chinese Vim tutor) and writes the dataset with a
validation split; specs/tiny.msl (vocab 512) with the data line it prints pasted in
compiles into generated/, and its train.py checks and reads the MindRecord, trains 60
steps stand-alone on the CPU and reports the validation loss."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.data_fixtures import ZH, english, msgen, write_spec
from tests.emit_fixtures import compile_spec

STEPS = 60


def test_text_to_a_falling_loss(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # as a user runs it: relative paths, from one folder
    topics = tmp_path / "topics.txt"
    topics.write_text("\n\n".join(english()), encoding="utf-8")
    spec = write_spec(tmp_path / "spec", pipeline=False)
    status, stdout, err = msgen(
        "data", spec, topics, ZH, "--paragraphs", "--train-tokenizer", "--valid", "0.05",
        "-o", "data",
    )  # fmt: skip
    assert status == 0, err
    # the line it prints, pasted as printed into the train block
    (line,) = stdout.splitlines()
    assert line.startswith("    data = mindrecord(") and 'valid = "' in line
    spec = write_spec(tmp_path / "spec", f"    {line.strip()}\n", pipeline=False)
    meta = json.loads((tmp_path / "data" / "dataset.json").read_text())
    assert meta["counts"]["train"]["steps"] >= STEPS  # one pass covers the run
    assert meta["counts"]["normalized_characters"] > 100

    folder = compile_spec(spec, tmp_path / "generated")
    env = {**os.environ, "GLOG_v": "3"}
    proc = subprocess.run(
        [sys.executable, "train.py", "--standalone", "--steps", str(STEPS)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with (folder / "output" / "rank_0" / "log.csv").open() as f:
        rows = list(csv.DictReader(f))
    losses = [float(row["loss"]) for row in rows]
    # The validation set is evaluated at the last step (eval_every defaults to 1000).
    assert [r["step"] for r in rows if r["valid_loss"]] == [str(STEPS)]
    assert float(rows[-1]["valid_loss"]) < 0.95 * np.log(512)
    assert f"step {STEPS}: valid loss" in proc.stdout
    assert len(losses) == STEPS and all(np.isfinite(losses))
    assert abs(losses[0] - np.log(512)) < 0.3  # uniform over the vocabulary at init
    # Real text, 60 steps: from uniform (6.24) to below 5.6, about 10% down.
    assert np.mean(losses[-5:]) < 0.9 * losses[0], losses


@pytest.mark.slow
def test_a_sharded_dataset_trains_as_one_file_of_its_windows(tmp_path, monkeypatch):
    """train.py reads a dataset.json's many files as one dataset: 4 steps from the
    manifest of several unit files give the losses of 4 steps from one MindRecord file
    holding the same windows in the same order (written here with FileWriter)."""
    from mindspore.mindrecord import FileWriter

    from tests.data_fixtures import read_set, write_jsonl

    monkeypatch.chdir(tmp_path)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    docs = english()
    for i in range(0, len(docs), 10):
        write_jsonl(corpus / f"part-{i:03d}.jsonl", docs[i : i + 10])
    spec = write_spec(tmp_path / "spec", pipeline=False)
    status, _, err = msgen("data", spec, corpus, "--train-tokenizer", "-o", "data",
                           "--workers", "2")  # fmt: skip
    assert status == 0, err
    meta = json.loads((tmp_path / "data" / "dataset.json").read_text())
    assert len(meta["files"]["train"]) > 5
    windows = read_set(tmp_path / "data", "train")
    one = tmp_path / "one" / "train.mindrecord"
    one.parent.mkdir()
    writer = FileWriter(str(one), shard_num=1)
    writer.add_schema({"input_ids": {"type": "int32", "shape": [-1]}}, "the same windows")
    writer.write_raw_data([{"input_ids": w} for w in windows])
    writer.commit()
    losses = {}
    for name, path in (("sharded", tmp_path / "data" / "dataset.json"), ("one", one)):
        line = f'    data = mindrecord("{path}")\n'
        folder = compile_spec(write_spec(tmp_path / name, line, pipeline=False),
                              tmp_path / f"gen-{name}")  # fmt: skip
        proc = subprocess.run(
            [sys.executable, "train.py", "--standalone", "--steps", "4"],
            cwd=folder, env={**os.environ, "GLOG_v": "3"}, capture_output=True, text=True,
            timeout=900,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        with (folder / "output" / "rank_0" / "log.csv").open() as f:
            losses[name] = [row["loss"] for row in csv.DictReader(f)]
    assert len(losses["one"]) == 4 and losses["sharded"] == losses["one"]
