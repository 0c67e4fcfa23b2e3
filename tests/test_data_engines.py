"""`msgen data` on many workers: the same bytes for --workers 1 and N (and Ray, in
test_data_ray.py), each unit's windows as a reference packer derives them from the
unit rule (a file; the lines that start inside a byte range of a large file),
--resume after kill -9 at three points, a raising worker named by its source file,
and digests that catch a changed file. (A worker's memory: test_data_memory.py.)
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from msgen.data.normalize import normalize
from tests.data_fixtures import (
    ROOT,
    chinese,
    english,
    msgen,
    read_set,
    write_jsonl,
    write_spec,
)

UNIT = 64 << 10  # --unit-size in these tests: the large files split into ranges
LENGTH = 33  # specs/tiny.msl: seq + 1


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    from msgen.data.tokenizer import train

    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    path.write_text(train(english() + chinese(), 512).to_str(), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """210 files under one folder: 206 small JSON Lines files and plain text, and four
    JSON Lines files of 150 to 400 KB that --unit-size 64K splits into ranges."""
    folder = tmp_path_factory.mktemp("corpus")
    docs = english() + chinese()
    for i in range(200):
        write_jsonl(folder / f"small-{i:03d}.jsonl", docs[i % len(docs) : i % len(docs) + 2])
    for i in range(6):
        (folder / f"page-{i}.txt").write_text(docs[(7 * i) % len(docs)], encoding="utf-8")
    for i, repeat in enumerate((1, 2, 2, 3)):
        write_jsonl(folder / f"large-{i}.jsonl", docs[i * 40 :] * repeat + docs[: i * 40])
    return folder


def spec_for(tmp_path: Path) -> Path:
    return write_spec(tmp_path / "spec", pipeline=False)


def run_data(spec, corpus, tokenizer, out, *extra) -> str:
    status, _, err = msgen("data", spec, corpus, "--tokenizer", tokenizer, "-o", out,
                           "--unit-size", str(UNIT), *extra)  # fmt: skip
    assert status == 0, err
    return err


def files_of(folder: Path) -> dict[str, str]:
    """The digest of each file in `folder` (hashlib's own, read in pieces)."""
    digests = {}
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        with path.open("rb") as f:
            digests[path.name] = hashlib.file_digest(f, "sha256").hexdigest()
    return digests


def expected_units(corpus: Path) -> list[list[str]]:
    """The documents of each unit, derived from the rule in docs/data.md: a folder's
    files in sorted order; a JSON Lines file larger than the unit size is cut at
    multiples of it, and a range holds the lines that start inside it."""
    units = []
    for path in sorted(p for p in corpus.rglob("*") if p.is_file()):
        data = path.read_bytes()
        if path.suffix == ".txt":
            units.append([data.decode()])
            continue
        starts = [0] + [i + 1 for i, b in enumerate(data) if b == 0x0A][:-1]
        lines = [json.loads(line)["text"] for line in data.decode().splitlines()]
        cuts = range(0, len(data), UNIT) if len(data) > UNIT else [0]
        for cut in cuts:
            units.append([t for s, t in zip(starts, lines) if cut <= s < cut + UNIT])
    return units


def reference_windows(tokenizer_file: Path, units: list[list[str]]) -> np.ndarray:
    """Each unit's documents, normalised and encoded one by one, EOS after each, cut
    into windows of LENGTH; the unit's tail after its last window dropped."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    tok.encode_special_tokens = True
    eos = tok.token_to_id("<|endoftext|>")
    rows = []
    for docs in units:
        stream = []
        for doc in docs:
            text = normalize(doc, "NFKC")[0]
            stream += tok.encode(text, add_special_tokens=False).ids + [eos]
        rows += [stream[s : s + LENGTH] for s in range(0, len(stream) - LENGTH + 1, LENGTH)]
    return np.array(rows, np.int32)


@pytest.mark.slow
def test_workers_give_the_bytes_one_worker_gives(tmp_path, corpus, tokenizer_file):
    spec = spec_for(tmp_path)
    assert len(list(corpus.iterdir())) >= 200
    one, many = tmp_path / "one", tmp_path / "many"
    run_data(spec, corpus, tokenizer_file, one, "--workers", "1", "--valid", "0.1")
    err = run_data(spec, corpus, tokenizer_file, many, "--workers", "3", "--valid", "0.1")
    assert "on 3 workers" in err
    assert files_of(one) == files_of(many)
    meta = json.loads((one / "dataset.json").read_text())
    units = expected_units(corpus)
    assert len(units) > len(list(corpus.iterdir()))  # the large files are split
    assert len(meta["files"]["train"]) > 200 and meta["files"]["valid"]
    # every file listed, with its index, and the digest of its bytes
    digests = files_of(one)
    for name in meta["files"]["train"] + meta["files"]["valid"]:
        for file in (name, f"{name}.db"):
            assert meta["digests"][file] == digests[file]


@pytest.mark.slow
def test_each_unit_is_packed_as_the_unit_rule_says(tmp_path, corpus, tokenizer_file):
    spec = spec_for(tmp_path)
    out = tmp_path / "out"
    run_data(spec, corpus, tokenizer_file, out, "--workers", "2")
    expected = reference_windows(tokenizer_file, expected_units(corpus))
    got = read_set(out, "train")
    assert got.shape == expected.shape and (got == expected).all()
    meta = json.loads((out / "dataset.json").read_text())
    assert meta["counts"]["train"]["windows"] == len(expected)


def run_subprocess(args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"}
    return subprocess.Popen(
        [sys.executable, "-m", "msgen.cli", *map(str, args)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def records(out: Path) -> int:
    return len(list(out.glob(".msgen-data-partial/units/*.json")))


@pytest.mark.slow
def test_kill_9_then_resume_gives_the_same_dataset(tmp_path, tokenizer_file):
    """SIGKILL after the first unit, half-way, and near the end; each time --resume
    finishes with the bytes of a run never killed, doing only the units left."""
    spec = spec_for(tmp_path)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    docs = english() + chinese()
    for i in range(12):
        write_jsonl(corpus / f"part-{i:02d}.jsonl", docs[i:] + docs[:i])
    clean = tmp_path / "clean"
    run_data(spec, corpus, tokenizer_file, clean, "--workers", "2", "--valid", "0.1")
    base = ["data", spec, corpus, "--tokenizer", tokenizer_file, "--unit-size", str(UNIT),
            "--workers", "2", "--valid", "0.1"]  # fmt: skip
    total = len(json.loads((clean / "dataset.json").read_text())["files"]["train"])
    for point in (1, total // 2, total - 2):
        out = tmp_path / f"out-{point}"
        proc = run_subprocess([*base, "-o", out], tmp_path)
        deadline = time.monotonic() + 300
        while records(out) < point:
            assert proc.poll() is None, f"the run ended before unit {point}"
            assert time.monotonic() < deadline
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        done = records(out)
        assert 0 < done < total and not (out / "dataset.json").exists()
        status, _, err = msgen(*base, "-o", out)  # without --resume: refused? no: restarts
        assert status == 0, err
        assert files_of(out) == files_of(clean)
        # once more, killed, and resumed this time
        out = tmp_path / f"resumed-{point}"
        proc = run_subprocess([*base, "-o", out], tmp_path)
        while records(out) < point:
            assert proc.poll() is None, f"the run ended before unit {point}"
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        done = records(out)
        status, _, err = msgen(*base, "-o", out, "--resume")
        assert status == 0, err
        assert f"{done:,} units were done before (--resume)" in err
        assert files_of(out) == files_of(clean)
        assert not list(out.glob(".msgen-data-*"))


@pytest.mark.slow  # 200+ units: 20 to 70 s on a loaded machine
def test_a_raising_worker_is_reported_by_its_source_file(tmp_path, corpus, tokenizer_file,
                                                         monkeypatch):  # fmt: skip
    """A worker's error names the unit's file; no dataset.json; the units done are
    kept for --resume, which then finishes with the bytes of a clean run."""
    from msgen.data import work

    spec = spec_for(tmp_path)
    out = tmp_path / "out"
    real = work.read_unit
    broken = corpus / "small-117.jsonl"

    def read_or_raise(unit):
        if unit.source.path == broken:
            raise ValueError("boom in the worker")
        return real(unit)

    monkeypatch.setattr(work, "read_unit", read_or_raise)  # the forked workers inherit it
    status, _, err = msgen("data", spec, corpus, "--tokenizer", tokenizer_file, "-o", out,
                           "--unit-size", str(UNIT), "--workers", "2")  # fmt: skip
    assert status == 2
    assert f"({broken}) failed: ValueError: boom in the worker" in err, err
    assert "--resume" in err and not (out / "dataset.json").exists()
    monkeypatch.setattr(work, "read_unit", real)
    status, _, err = msgen("data", spec, corpus, "--tokenizer", tokenizer_file, "-o", out,
                           "--unit-size", str(UNIT), "--workers", "2", "--resume")  # fmt: skip
    assert status == 0, err
    clean = tmp_path / "clean"
    run_data(spec, corpus, tokenizer_file, clean, "--workers", "2")
    assert files_of(out) == files_of(clean)


@pytest.mark.slow  # 200+ units: 20 to 70 s on a loaded machine
def test_resume_redoes_a_unit_whose_file_changed(tmp_path, corpus, tokenizer_file, monkeypatch):
    """A unit record's digests are checked: a changed file is done again, and a
    record whose digest no longer matches is not trusted."""
    from msgen.data import work

    spec = spec_for(tmp_path)
    out = tmp_path / "out"
    real = work.read_unit

    def read_or_raise(unit):
        if unit.source.path.name == "small-199.jsonl":
            raise ValueError("stop here")
        return real(unit)

    monkeypatch.setattr(work, "read_unit", read_or_raise)
    args = ("data", spec, corpus, "--tokenizer", tokenizer_file, "-o", out,
            "--unit-size", str(UNIT), "--workers", "1")  # fmt: skip
    assert msgen(*args)[0] == 2  # one worker, in order: every unit before it is done
    monkeypatch.setattr(work, "read_unit", real)
    partial = out / ".msgen-data-partial"
    changed = partial / "train-00003.mindrecord"
    data = bytearray(changed.read_bytes())
    data[-5] ^= 1  # one bit of one token id
    changed.write_bytes(bytes(data))
    done = records(out)
    status, _, err = msgen(*args, "--resume")
    assert status == 0, err
    assert f"{done - 1:,} units were done before (--resume)" in err
    clean = tmp_path / "clean"
    run_data(spec, corpus, tokenizer_file, clean, "--workers", "1")
    assert files_of(out) == files_of(clean)


@pytest.mark.slow  # 200+ units: 20 to 70 s on a loaded machine
def test_resume_or_force_is_needed_over_a_dataset(tmp_path, corpus, tokenizer_file):
    spec = spec_for(tmp_path)
    out = tmp_path / "out"
    run_data(spec, corpus, tokenizer_file, out, "--workers", "2")
    for extra in ((), ("--resume",)):
        status, _, err = msgen("data", spec, corpus, "--tokenizer", tokenizer_file, "-o", out,
                               "--unit-size", str(UNIT), *extra)  # fmt: skip
        assert status == 2 and "already holds a dataset" in err


def test_two_workers_write_what_one_writes_small(tmp_path, tokenizer_file):
    """The quick form of the engines test: 8 files, one of them cut into 3 ranges."""
    spec = spec_for(tmp_path)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    docs = english() + chinese()
    for i in range(7):
        write_jsonl(corpus / f"part-{i}.jsonl", docs[i * 5 : i * 5 + 5])
    write_jsonl(corpus / "zlarge.jsonl", docs[:60])
    size = (corpus / "zlarge.jsonl").stat().st_size
    unit = str(size // 3 + 1)
    outs = []
    for workers in ("1", "2"):
        out = tmp_path / f"w{workers}"
        status, _, err = msgen("data", spec, corpus, "--tokenizer", tokenizer_file, "-o", out,
                               "--unit-size", unit, "--workers", workers, "--valid", "0.2")  # fmt: skip
        assert status == 0, err
        assert f"10 units on {workers} worker" in err
        outs.append(files_of(out))
    assert outs[0] == outs[1]
