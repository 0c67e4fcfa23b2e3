"""Hostile input and damaged state for `msgen data`: files it did not write, a second
run, special-token text, malformed and huge inputs, FIFOs and devices, tokenizers
that fail or panic, signals, and names that would forge output. Each ends in the
dataset documented, or one line and exit 2, never a traceback, a hang or a lost
file.

The class each case stands for is closed where the code for it lives: every input
and tokenizer file goes through one regular-file opener, every reader through one
error wrapper, every message prints names through one escaper.
"""

from __future__ import annotations

import fcntl
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.data_fixtures import (
    ROOT,
    VOCAB,
    chinese,
    english,
    msgen,
    read_set,
    write_jsonl,
    write_spec,
)

EOT = "<|endoftext|>"


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    from msgen.data.tokenizer import train

    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    path.write_text(train(english() + chinese(), VOCAB).to_str(), encoding="utf-8")
    return path


@pytest.fixture
def spec(tmp_path) -> Path:
    return write_spec(tmp_path / "spec", pipeline=False)  # its valid set is named (MSL514)


@pytest.fixture
def corpus(tmp_path) -> Path:
    return write_jsonl(tmp_path / "corpus.jsonl", english())


def one_line_error(status: int, err: str, *parts: str) -> None:
    assert status == 2, err
    assert "Traceback" not in err and "internal error" not in err, err
    # documents skipped before the error are warned about as usual
    lines = [line for line in err.splitlines() if not line.startswith("  = hint")]
    lines = [line for line in lines if "warning[MSL603]" not in line]
    assert len(lines) == 1 and lines[0].startswith("msgen: error: "), err
    for part in parts:
        assert part in lines[0], (part, err)


def subprocess_msgen(*args, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"}
    return subprocess.run(
        [sys.executable, "-m", "msgen.cli", *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# H1: only files a previous dataset.json records are msgen's ----------------------


def test_files_no_dataset_recorded_are_never_removed(spec, tmp_path, corpus, tokenizer_file):
    out = tmp_path / "out"
    out.mkdir()
    mine = {
        "tokenizer.json": b"my tokenizer",
        "valid-00000.mindrecord": b"mine",
        "valid-00000.mindrecord.db": b"x",
    }
    for name, data in mine.items():
        (out / name).write_bytes(data)
    status, _, err = msgen("data", spec, corpus, "--tokenizer", tokenizer_file, "-o", out)
    assert status == 0, err
    for name, data in mine.items():
        assert (out / name).read_bytes() == data, name


def test_a_file_in_the_way_is_refused_even_with_force(spec, tmp_path, corpus, tokenizer_file):
    out = tmp_path / "out"
    out.mkdir()
    (out / "train-00000.mindrecord").write_bytes(b"hand-written")
    args = ("data", spec, corpus, "--tokenizer", tokenizer_file, "-o", out, "--force")
    status, _, err = msgen(*args)
    one_line_error(status, err, f"{out}/train-00000.mindrecord is in the way")
    assert (out / "train-00000.mindrecord").read_bytes() == b"hand-written"
    assert sorted(p.name for p in out.iterdir()) == ["train-00000.mindrecord"]


def test_force_replaces_what_the_previous_dataset_recorded(spec, tmp_path, corpus, tokenizer_file):
    out = tmp_path / "out"
    base = ("data", spec, corpus, "--tokenizer", tokenizer_file, "-o", out)
    assert msgen(*base, "--valid", "0.2")[0] == 0
    (out / "notes.md").write_text("mine")
    status, _, err = msgen(*base, "--force")
    assert status == 0, err
    names = sorted(p.name for p in out.iterdir())
    assert names == ["dataset.json", "notes.md", "train-00000.mindrecord",
                     "train-00000.mindrecord.db"]  # fmt: skip


# H7: one run at a time ---------------------------------------------------------


def test_a_folder_another_run_is_writing_is_refused(spec, tmp_path, corpus, tokenizer_file):
    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as a run writing there holds it
    try:
        status, _, err = msgen("data", spec, corpus, "--tokenizer", tokenizer_file, "-o", out)
    finally:
        os.close(fd)
    one_line_error(status, err, "another msgen data run is writing to")
    assert list(out.iterdir()) == []


def test_two_runs_into_one_new_folder_never_both_succeed(spec, tmp_path, tokenizer_file):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", english() * 3)
    out = tmp_path / "out"
    args = [sys.executable, "-m", "msgen.cli", "data", spec, corpus, "--tokenizer",
            tokenizer_file, "-o", out]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"}
    procs = [
        subprocess.Popen(list(map(str, args)), cwd=tmp_path, env=env, stderr=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]  # fmt: skip
    results = [(p.wait(timeout=300), p.communicate()[1]) for p in procs]
    statuses = sorted(status for status, _ in results)
    assert statuses == [0, 2], results
    (err,) = [err for status, err in results if status == 2]
    assert "another msgen data run is writing" in err or "already holds a dataset" in err
    assert not list(out.glob(".msgen-data-*"))


# H6: special-token text is text ------------------------------------------------


@pytest.mark.parametrize("trained", [False, True])
def test_special_token_text_in_a_document_is_not_an_eos(spec, tmp_path, tokenizer_file, trained):
    from tokenizers import Tokenizer

    docs = [f"{topic[:400]} {EOT} and {EOT} again" for topic in english()[:20]] + english()[20:]
    corpus = write_jsonl(tmp_path / "corpus.jsonl", docs)
    out = tmp_path / "out"
    how = ["--train-tokenizer"] if trained else ["--tokenizer", tokenizer_file]
    status, stdout, err = msgen("data", spec, corpus, *how, "-o", out)
    assert status == 0, err
    meta = json.loads((out / "dataset.json").read_text())
    stream = read_set(out, "train").reshape(-1)
    # EOS only between documents: at most one per document
    assert (stream == meta["eos_id"]).sum() <= len(docs)
    assert meta["counts"]["special_token_texts"] == 40
    tok = Tokenizer.from_file(str(out / "tokenizer.json" if trained else tokenizer_file))
    first = stream[: int(np.argmax(stream == meta["eos_id"]))]
    assert tok.decode(first.tolist(), skip_special_tokens=False).count(EOT) == 2


# H12: malformed input after the pre-checks -------------------------------------


def test_a_deeply_nested_json_line_is_skipped(spec, tmp_path, tokenizer_file):
    corpus = tmp_path / "corpus.jsonl"
    lines = [json.dumps({"text": t}) for t in english()]
    corpus.write_text("\n".join(lines[:3] + ["[" * 100_000 + "]" * 100_000] + lines[3:]) + "\n")
    out = tmp_path / "out"
    status, _, err = msgen("data", spec, corpus, "--tokenizer", tokenizer_file, "-o", out)
    assert status == 0, err
    assert f"{corpus}:4:1: warning[MSL603]: not JSON, document skipped" in err
    assert json.loads((out / "dataset.json").read_text())["counts"]["skipped"] == {"not JSON": 1}


def gz_cases(data: bytes) -> dict[str, bytes]:
    good = gzip.compress(data)
    middle = len(good) // 2
    bad_crc = bytearray(good)
    bad_crc[-8] ^= 0xFF  # the CRC32 in the trailer
    return {
        "truncated": good[:middle],
        "corrupt": good[:middle] + bytes(b ^ 0x5A for b in good[middle : middle + 64])
        + good[middle + 64 :],
        "bad_crc": bytes(bad_crc),
        "not_gzip": b"plain text, not gzip\n" * 100,
    }  # fmt: skip


@pytest.mark.parametrize("case", ["truncated", "corrupt", "bad_crc", "not_gzip"])
def test_a_damaged_gz_is_one_line_naming_it(spec, tmp_path, tokenizer_file, case):
    data = "".join(json.dumps({"text": t}) + "\n" for t in english()).encode()
    path = tmp_path / f"{case}.jsonl.gz"
    path.write_bytes(gz_cases(data)[case])
    out = tmp_path / "out"
    status, _, err = msgen("data", spec, path, "--tokenizer", tokenizer_file, "-o", out)
    one_line_error(status, err, f"cannot read {path} past byte ")
    assert not out.exists()


def test_a_corrupt_parquet_page_is_one_line_naming_it(spec, tmp_path, tokenizer_file):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"text": english()}), path)  # snappy: a checked page
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4000] = b"\xff" * 4000  # inside the column's pages
    path.write_bytes(bytes(data))
    out = tmp_path / "out"
    status, _, err = msgen("data", spec, path, "--tokenizer", tokenizer_file, "-o", out)
    one_line_error(status, err, f"cannot read {path} as Parquet")
    assert not out.exists()


def test_a_gz_that_inflates_like_a_bomb_is_refused(spec, tmp_path, tokenizer_file, monkeypatch):
    from msgen.data import readers

    monkeypatch.setattr(readers, "RATIO_GRACE", 1 << 20)  # the first MiB unchecked, not 16
    path = tmp_path / "bomb.txt.gz"
    path.write_bytes(gzip.compress(b"a" * (4 << 20), 9))  # 4 MiB in about 4 KB
    status, _, err = msgen("data", spec, path, "--tokenizer", tokenizer_file, "-o", tmp_path / "o")
    one_line_error(status, err, f"{path} inflates more than 200 times its size")
    assert not (tmp_path / "o").exists()


def tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0  # fmt: skip


def test_a_full_disk_is_one_line(spec, tmp_path, tokenizer_file):
    small = tmp_path / "small"
    if not tmpfs(small, "1m"):
        pytest.skip("needs a small file system: root, to mount a tmpfs")
    try:
        corpus = write_jsonl(tmp_path / "corpus.jsonl", english() * 4)
        status, _, err = msgen(
            "data", spec, corpus, "--tokenizer", tokenizer_file, "-o", small / "out"
        )
        one_line_error(status, err, f"disk full writing {small}/out/")
        assert list(small.iterdir()) == []
    finally:
        subprocess.run(["umount", str(small)], check=True)


@pytest.mark.slow
def test_memory_is_bounded_by_the_batch_not_the_document(spec, tmp_path, tokenizer_file):
    """A .gz that unpacks to one 17 MiB line took 3 GiB (one of 64 MiB: over 10). Now the
    line is cut into documents of 16 MiB, each tokenized a piece at a time."""
    path = tmp_path / "line.txt.gz"
    text = " ".join(english())
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write((text * (17 * 2**20 // len(text) + 1))[: 17 * 2**20].replace("\n", " "))
    out = tmp_path / "out"
    code = (
        "import resource, sys; from msgen.cli import main; "
        f"status = main(['data', {str(spec)!r}, {str(path)!r}, '--tokenizer', "
        f"{str(tokenizer_file)!r}, '-o', {str(out)!r}]); "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(status)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    peak_mib = int(proc.stdout.split()[-1]) / 1024
    assert peak_mib < 1500, peak_mib  # MindSpore's import alone is ~450 MiB
    meta = json.loads((out / "dataset.json").read_text())
    assert meta["counts"]["documents"] == meta["counts"]["cut_documents"] == 2  # 16 + 1


# H15: only regular files are read -----------------------------------------------


def test_a_fifo_or_device_as_tokenizer_is_refused(spec, tmp_path, corpus):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.json"
    zero.symlink_to("/dev/zero")
    for path in (fifo, zero):
        proc = subprocess_msgen("data", spec, corpus, "--tokenizer", path, cwd=tmp_path, timeout=60)
        one_line_error(proc.returncode, proc.stderr, f"cannot read tokenizer {path}")


def test_a_fifo_beside_the_tokenizer_is_refused(spec, tmp_path, corpus, tokenizer_file):
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(tokenizer_file.read_bytes())
    os.mkfifo(folder / "tokenizer_config.json")
    proc = subprocess_msgen(
        "data", spec, corpus, "--tokenizer", folder / "tokenizer.json", cwd=tmp_path, timeout=60
    )
    one_line_error(proc.returncode, proc.stderr, f"cannot read {folder}/tokenizer_config.json")


def test_a_fifo_input_is_named_as_such(spec, tmp_path, tokenizer_file):
    fifo = tmp_path / "corpus.jsonl"
    os.mkfifo(fifo)
    status, _, err = msgen("data", spec, fifo, "--tokenizer", tokenizer_file)
    one_line_error(status, err, f"{fifo} is not a regular file")


# H16: a tokenizer that fails, or panics -----------------------------------------

BROKEN = {
    # a SentencePiece charsmap that does not parse: the library panics
    "panics": {
        "version": "1.0",
        "normalizer": {"type": "Precompiled", "precompiled_charsmap": "AAAA"},
        "model": {"type": "WordLevel", "vocab": {"[UNK]": 0}, "unk_token": "[UNK]"},
    },
    "empty": {"version": "1.0", "model": {"type": "BPE", "vocab": {}, "merges": []}},
    # encodes "Hello" only; any other word fails (a WordLevel model without its [UNK])
    "no_unk": {
        "version": "1.0",
        "pre_tokenizer": {"type": "Whitespace"},
        "model": {"type": "WordLevel", "vocab": {"Hello": 0, EOT: 1}, "unk_token": "[UNK]"},
        "added_tokens": [
            {
                "id": 1,
                "content": EOT,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        ],
    },
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_tokenizer_is_one_line(spec, tmp_path, corpus, case):
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(BROKEN[case]))
    proc = subprocess_msgen("data", spec, corpus, "--tokenizer", path, cwd=tmp_path)
    one_line_error(proc.returncode, proc.stderr, str(path))
    assert "panicked" not in proc.stderr


# H17: SIGTERM and SIGHUP clean up; stale staging folders go -------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_leaves_no_staging_folder(spec, tmp_path, tokenizer_file, signum):
    big = write_jsonl(tmp_path / "big.jsonl", (english() + chinese()) * 8)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"}
    args = ["data", spec, big, "--tokenizer", tokenizer_file, "-o", out]
    proc = subprocess.Popen([sys.executable, "-m", "msgen.cli", *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while not any(out.glob(".msgen-data-*/train-*.mindrecord")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert not out.exists()


def test_staging_folders_of_dead_runs_are_removed(spec, tmp_path, corpus, tokenizer_file):
    out = tmp_path / "out"
    out.mkdir()
    stale = out / ".msgen-data-99999999-abc"
    stale.mkdir()
    (stale / "train.mindrecord").write_bytes(b"\0" * 1000)
    status, _, err = msgen("data", spec, corpus, "--tokenizer", tokenizer_file, "-o", out)
    assert status == 0, err
    assert not stale.exists()
    assert sorted(p.name for p in out.iterdir()) == [
        "dataset.json", "train-00000.mindrecord", "train-00000.mindrecord.db"
    ]  # fmt: skip


# H19: messages ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["x\x1b[31mred.jsonl", "a\nwarning: forged.jsonl"])
def test_file_names_cannot_forge_output(spec, tmp_path, tokenizer_file, name):
    path = tmp_path / name
    lines = [json.dumps({"text": t}) for t in english()]
    path.write_text("\n".join(["not json"] + lines) + "\n")
    status, _, err = msgen("data", spec, path, "--tokenizer", tokenizer_file, "-o", tmp_path / "o")
    assert status == 0, err
    assert "\x1b" not in err
    assert not any(line.startswith("warning: forged") for line in err.splitlines())
    escaped = name.encode("unicode_escape").decode()
    assert f"{tmp_path}/{escaped}:1:1: warning[MSL603]: not JSON" in err


def test_an_output_a_spec_string_cannot_hold_is_refused(spec, tmp_path, corpus, tokenizer_file):
    out = tmp_path / 'x"y'
    status, _, err = msgen("data", spec, corpus, "--tokenizer", tokenizer_file, "-o", out)
    one_line_error(status, err, "a spec's string cannot hold the path")
    assert not out.exists()


@pytest.mark.parametrize("fmt", ["json", "github"])
def test_warnings_and_summary_follow_the_error_format(spec, tmp_path, tokenizer_file, fmt):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("not json\n" + "".join(json.dumps({"text": t}) + "\n" for t in english()))
    args = ("data", spec, corpus, "--tokenizer", tokenizer_file, "-o", tmp_path / "o")
    status, stdout, err = msgen(*args, "--error-format", fmt)
    assert status == 0, err
    lines = err.splitlines()
    assert len(lines) == 2, err  # the warning and the summary
    if fmt == "json":
        warning, summary = map(json.loads, lines)
        assert warning["code"] == "MSL603" and warning["line"] == 1
        assert summary["summary"]["counts"]["skipped"] == {"not JSON": 1}
        assert summary["summary"]["data"] in stdout
    else:
        assert lines[0].startswith("::warning file=") and "title=MSL603" in lines[0]
        assert lines[1].startswith("::notice title=msgen data::")
    assert stdout.startswith('    data = mindrecord("')


def test_an_output_under_a_dangling_link_names_the_path(spec, tmp_path, corpus, tokenizer_file):
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    out = tmp_path / "link" / "out"
    status, _, err = msgen("data", spec, corpus, "--tokenizer", tokenizer_file, "-o", out)
    one_line_error(status, err, str(tmp_path / "link"))


def test_a_wrong_field_blames_the_field_not_seq(spec, tmp_path, tokenizer_file):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": i, "body": t}) + "\n" for i, t in enumerate(english()))
    )
    status, _, err = msgen(
        "data", spec, corpus, "--tokenizer", tokenizer_file, "-o", tmp_path / "o"
    )
    one_line_error(status, err, "no document to write", "no string field `text`")
    assert "the first record's keys are id, body; --field names the one" in err
    assert "MSL602" not in err


def test_dataset_json_holds_no_absolute_path(spec, tmp_path, corpus, tokenizer_file):
    out = tmp_path / "data" / "out"
    status, _, err = msgen("data", spec, corpus, "--tokenizer", tokenizer_file, "-o", out)
    assert status == 0, err
    meta = json.loads((out / "dataset.json").read_text())
    recorded = meta["tokenizer"]["path"]
    assert not Path(recorded).is_absolute() and str(tmp_path) not in json.dumps(meta["tokenizer"])
    assert (out / recorded).resolve() == tokenizer_file.resolve()


def test_a_byte_order_mark_keeps_the_first_document(spec, tmp_path, tokenizer_file):
    docs = english()
    for name in ("bom.jsonl", "bom.txt"):
        path = tmp_path / name
        if name.endswith(".jsonl"):
            path.write_bytes(
                b"\xef\xbb\xbf" + write_jsonl(tmp_path / "plain.jsonl", docs).read_bytes()
            )
        else:
            path.write_bytes(b"\xef\xbb\xbf" + "\n\n".join(docs).encode())
        out = tmp_path / f"out_{name}"
        args = ("data", spec, path, "--tokenizer", tokenizer_file, "-o", out, "--paragraphs")
        status, _, err = msgen(*args)
        assert status == 0, err
        counts = json.loads((out / "dataset.json").read_text())["counts"]
        assert counts["skipped"] == {}
        expected = len(docs) if name.endswith(".jsonl") else len(
            [p for p in "\n\n".join(docs).split("\n\n") if p.strip()]
        )  # fmt: skip
        assert counts["documents"] == expected
        assert "\ufeff" not in (tmp_path / "plain.jsonl").read_text()  # the oracle's own input


def test_a_failed_run_leaves_no_folder_it_made(spec, tmp_path, tokenizer_file):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", [t[:50] for t in english()[:3]])
    out = tmp_path / "a" / "b" / "c" / "out"
    status, _, err = msgen("data", spec, corpus, "--tokenizer", tokenizer_file, "-o", out)
    assert status == 1 and "MSL602" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl", "spec"]


# issue: the data line works where train.py runs ----------------------------------


def test_the_data_line_is_relative_to_where_train_py_runs(spec, tmp_path, corpus, tokenizer_file,
                                                          monkeypatch):  # fmt: skip
    monkeypatch.chdir(tmp_path)
    status, stdout, err = msgen(
        "data", spec, corpus, "--tokenizer", tokenizer_file, "-o", "data/tiny", "--valid", "0.2"
    )
    assert status == 0, err
    paths = json.loads("[" + stdout.split("mindrecord(")[1].replace("valid = ", "")[:-2] + "]")
    train_py = tmp_path / "generated" / "tiny"  # where `msgen compile SPEC -o generated/` puts it
    assert (train_py / paths[0]).resolve() == (tmp_path / "data/tiny/dataset.json").resolve()
    assert (train_py / paths[1]).resolve() == (tmp_path / "data/tiny/dataset.json").resolve()
    assert "paths relative to generated/tiny/" in err
    status, stdout, err = msgen(
        "data", spec, corpus, "--tokenizer", tokenizer_file, "-o", "d2", "--for", "runs/x"
    )
    assert status == 0, err
    assert 'data = mindrecord("../../d2/dataset.json")' in stdout
