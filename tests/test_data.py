"""`msgen data` rule by rule: normalisation, EOS between documents, exact windows with
their overlap, the document-level validation split, dedup, determinism, the checks
made before any work, skipped documents, and all-or-nothing output (--force, Ctrl-C).

Datasets are read back with MindSpore's own FileReader, and the expected token
streams are built with the tokenizer directly, document by document.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from msgen.data.normalize import normalize
from msgen.data.pack import Packer
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

SEQ = 32  # specs/tiny.msl
DATA_FILES = ["dataset.json", "train-00000.mindrecord", "train-00000.mindrecord.db"]


# normalisation ----------------------------------------------------------------


@pytest.mark.parametrize(
    "form, text, expected, changed",
    [
        ("NFKC", "ＧＰＴ，你好：（一）", "GPT,你好:(一)", 7),  # full-width Latin, punctuation
        ("NFKC", "ﬁle ①②", "file 12", 3),  # ligature, circled digits
        ("NFKC", "ｶﾀｶﾅ", "カタカナ", 4),  # half-width katakana
        ("NFKC", "cafe\u0301", "café", 1),  # composition: the mark merges
        ("NFKC", "plain ascii。", "plain ascii。", 0),  # 。 is not a compatibility form
        ("NFC", "ＧＰＴ，", "ＧＰＴ，", 0),  # NFC keeps compatibility characters
        ("NFC", "cafe\u0301", "café", 1),
        (None, "ＧＰＴ", "ＧＰＴ", 0),
    ],
)
def test_normalize_changes_what_it_should(form, text, expected, changed):
    assert normalize(text, form) == (expected, changed)


# packing ----------------------------------------------------------------------


@given(
    docs=st.lists(st.lists(st.integers(1, 99), max_size=40), min_size=1, max_size=30),
    batches=st.integers(1, 5),
    length=st.integers(2, 17),
    overlap_fraction=st.floats(0, 0.99),
)
def test_windows_are_the_stream_cut_at_the_stride(docs, batches, length, overlap_fraction):
    overlap = int(overlap_fraction * length)
    packer = Packer(length, overlap)
    out = [packer.add([t for d in docs[i::batches] for t in [*d, 0]]) for i in range(batches)]
    windows = np.concatenate(out)
    order = [d for i in range(batches) for d in docs[i::batches]]
    stream = [t for d in order for t in [*d, 0]]  # EOS after every document
    stride = length - overlap
    expected = [stream[s : s + length] for s in range(0, len(stream) - length + 1, stride)]
    assert windows.dtype == np.int32 and windows.shape == (len(expected), length)
    assert windows.tolist() == expected
    covered = (len(expected) - 1) * stride + length if expected else 0
    assert packer.dropped == len(stream) - covered
    assert packer.tokens == len(stream)


# the command ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    from msgen.data.tokenizer import train

    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    path.write_text(train(english() + chinese(), VOCAB).to_str(), encoding="utf-8")
    return path


@pytest.fixture
def spec(tmp_path) -> Path:
    return write_spec(tmp_path / "spec", pipeline=False)  # its valid set is named (MSL514)


def docs_small() -> list[str]:
    return english()[:60] + chinese()


def encode(tokenizer_file: Path, docs: list[str]) -> list[list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    return [e.ids for e in tok.encode_batch([normalize(d, "NFKC")[0] for d in docs],
                                            add_special_tokens=False)]  # fmt: skip


def split_at(stream: list[int], eos: int) -> list[tuple[int, ...]]:
    """The complete documents of a stream (the piece after the last EOS is partial)."""
    docs, current = [], []
    for t in stream:
        if t == eos:
            docs.append(tuple(current))
            current = []
        else:
            current.append(t)
    return docs


def test_documents_are_joined_by_eos_into_exact_windows(spec, tmp_path, tokenizer_file):
    docs = docs_small()
    corpus = write_jsonl(tmp_path / "corpus.jsonl", docs)
    out = tmp_path / "data"
    status, stdout, err = msgen("data", spec, corpus, "--tokenizer", tokenizer_file, "-o", out)
    assert status == 0, err
    meta = json.loads((out / "dataset.json").read_text())
    eos = meta["eos_id"]
    assert meta["eos"] == "<|endoftext|>" and (meta["vocab"], meta["seq"]) == (VOCAB, SEQ)
    windows = read_set(out, "train")
    assert windows.dtype == np.int32 and windows.shape[1] == SEQ + 1
    expected = [t for ids in encode(tokenizer_file, docs) for t in [*ids, eos]]
    n = meta["counts"]["train"]["windows"]
    assert windows.shape[0] == n == len(expected) // (SEQ + 1)
    assert windows.reshape(-1).tolist() == expected[: n * (SEQ + 1)]
    assert meta["counts"]["train"]["dropped_tokens"] == len(expected) - n * (SEQ + 1)
    assert meta["counts"]["train"]["steps"] == n // 8
    assert meta["counts"]["normalized_characters"] > 100  # the tutor's full-width punctuation
    assert f'data = mindrecord("{out.as_posix()}/dataset.json")' in stdout


def test_overlap_repeats_n_tokens(spec, tmp_path, tokenizer_file):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", docs_small())
    out = tmp_path / "data"
    args = ("data", spec, corpus, "--tokenizer", tokenizer_file, "-o", out, "--overlap", "5")
    status, _, err = msgen(*args)
    assert status == 0, err
    windows = read_set(out, "train")
    assert windows.shape[1] == SEQ + 1
    assert (windows[1:, :5] == windows[:-1, -5:]).all()
    assert not (windows[1:, :6] == windows[:-1, -6:]).all(axis=1).all()


def test_no_document_is_in_both_train_and_valid(spec, tmp_path, tokenizer_file):
    docs = english() + chinese()
    corpus = write_jsonl(tmp_path / "corpus.jsonl", docs)
    out = tmp_path / "data"
    args = ("data", spec, corpus, "--tokenizer", tokenizer_file, "-o", out, "--valid", "0.1")
    status, stdout, err = msgen(*args)
    assert status == 0, err
    meta = json.loads((out / "dataset.json").read_text())
    eos = meta["eos_id"]
    train = split_at(read_set(out, "train").reshape(-1).tolist(), eos)
    valid = split_at(read_set(out, "valid").reshape(-1).tolist(), eos)
    assert len(valid) > 10 and len(train) > 10 * len(valid) / 2
    # Distinct documents only (two topics may share a text): none is on both sides.
    assert not set(train) & set(valid)
    every = {tuple(ids) for ids in encode(tokenizer_file, docs)}
    assert set(train) | set(valid) <= every
    counts = meta["counts"]
    assert counts["train"]["documents"] + counts["valid"]["documents"] == len(docs)
    assert 0.05 < counts["valid"]["documents"] / len(docs) < 0.15
    assert 'valid = "' in stdout and (out / "valid-00000.mindrecord").is_file()


def test_dedup_drops_exact_duplicates(spec, tmp_path, tokenizer_file):
    docs = list(dict.fromkeys(normalize(d, "NFKC")[0] for d in docs_small()))  # distinct
    corpus = write_jsonl(tmp_path / "corpus.jsonl", docs + docs[:7] + ["ＧＰＴ", "GPT"])
    out = tmp_path / "data"
    status, _, err = msgen(
        "data", spec, corpus, "--tokenizer", tokenizer_file, "-o", out, "--dedup"
    )
    assert status == 0, err
    meta = json.loads((out / "dataset.json").read_text())
    # the two GPTs are one document after NFKC
    assert meta["counts"]["duplicates"] == 8
    assert meta["counts"]["train"]["documents"] == len(docs) + 1
    eos = meta["eos_id"]
    kept = split_at(read_set(out, "train").reshape(-1).tolist(), eos)
    assert len(kept) == len(set(kept))


def run_subprocess(args, cwd, seed: str, **kwargs):
    env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT), "GLOG_v": "3"}
    return subprocess.Popen(
        [sys.executable, "-m", "msgen.cli", *map(str, args)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def test_same_input_same_bytes_whatever_the_hash_seed(spec, tmp_path):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", docs_small() + docs_small()[:5])
    procs = {
        seed: run_subprocess(
            ["data", spec, corpus, "--train-tokenizer", "--valid", "0.2", "--dedup",
             "-o", tmp_path / f"out{seed}"],
            tmp_path,
            seed,
        )
        for seed in ("1", "2")
    }  # fmt: skip
    for proc in procs.values():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    first, second = tmp_path / "out1", tmp_path / "out2"
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(p.name for p in second.iterdir())
    assert "tokenizer.json" in names and "valid-00000.mindrecord" in names
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_gzip_and_parquet_read_like_jsonl(spec, tmp_path, tokenizer_file):
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = docs_small()
    plain = write_jsonl(tmp_path / "corpus.jsonl", docs)
    zipped = tmp_path / "corpus.jsonl.gz"
    zipped.write_bytes(gzip.compress(plain.read_bytes()))
    parquet = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"id": list(range(len(docs))), "body": docs}), parquet)
    results = {}
    for name, extra in (("plain", [plain]), ("zipped", [zipped]),
                        ("parquet", [parquet, "--field", "body"])):  # fmt: skip
        out = tmp_path / name
        status, _, err = msgen("data", spec, *extra, "--tokenizer", tokenizer_file, "-o", out)
        assert status == 0, err
        results[name] = (out / "train-00000.mindrecord").read_bytes()
    assert results["plain"] == results["zipped"] == results["parquet"]


def test_text_files_by_file_or_by_paragraph(spec, tmp_path, tokenizer_file):
    topics = english()[:40]
    a, b = tmp_path / "a.txt", tmp_path / "b.md"
    a.write_text("\n\n\n".join(topics), encoding="utf-8")
    b.write_text("four", encoding="utf-8")
    counts = {}
    for mode in ([], ["--paragraphs"]):
        out = tmp_path / f"out{len(mode)}"
        status, _, err = msgen("data", spec, a, b, "--tokenizer", tokenizer_file, "-o", out, *mode)
        assert status == 0, err
        counts[len(mode)] = json.loads((out / "dataset.json").read_text())["counts"]
    assert counts[0]["documents"] == 2
    blocks = [p for t in topics for p in t.split("\n\n") if p.strip()]
    assert counts[1]["documents"] == len(blocks) + 1


def test_too_little_text_for_a_global_batch(spec, tmp_path, tokenizer_file):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", [t[:50] for t in english()[:3]])
    out = tmp_path / "data"
    status, _, err = msgen("data", spec, corpus, "--tokenizer", tokenizer_file, "-o", out)
    assert status == 1 and not out.exists()
    assert "error[MSL602]: the train set makes" in err and "fewer than one global batch (8)" in err


def test_tokenizer_larger_than_vocab_fails_before_work(tmp_path, tokenizer_file):
    spec = write_spec(tmp_path / "spec", vocab=384)
    corpus = write_jsonl(tmp_path / "corpus.jsonl", ["text"])
    out = tmp_path / "data"
    status, _, err = msgen("data", spec, corpus, "--tokenizer", tokenizer_file, "-o", out)
    assert status == 1
    assert "error[MSL601]: the tokenizer's ids go up to 511, beyond vocab = 384" in err
    assert "vocab  = 384" in err and "make vocab at least 512" in err
    assert not out.exists()


def test_byte_level_bpe_needs_more_than_256_ids(tmp_path):
    spec = write_spec(tmp_path / "spec", vocab=256)
    corpus = write_jsonl(tmp_path / "corpus.jsonl", ["text"])
    status, _, err = msgen("data", spec, corpus, "--train-tokenizer", "-o", tmp_path / "d")
    assert status == 1 and "error[MSL601]: vocab = 256 leaves no room" in err


def test_trained_tokenizer_keeps_eos_inside_vocab(spec, tmp_path):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", english())
    out = tmp_path / "data"
    status, _, err = msgen("data", spec, corpus, "--train-tokenizer", "-o", out)
    assert status == 0, err
    meta = json.loads((out / "dataset.json").read_text())
    tok = json.loads((out / "tokenizer.json").read_text())
    ids = list(tok["model"]["vocab"].values()) + [t["id"] for t in tok["added_tokens"]]
    assert max(ids) < VOCAB and meta["eos_id"] < VOCAB
    assert read_set(out, "train").max() < VOCAB
    assert meta["tokenizer"]["path"] == "tokenizer.json" and meta["tokenizer"]["trained"]


def test_tokenizer_without_eos_needs_eos_flag(spec, tmp_path, tokenizer_file):
    tok = json.loads(tokenizer_file.read_text())
    for t in tok["added_tokens"]:
        t["content"] = "<|sep|>"
    tok["model"]["vocab"]["<|sep|>"] = tok["model"]["vocab"].pop("<|endoftext|>")
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(tok))
    corpus = write_jsonl(tmp_path / "corpus.jsonl", docs_small())
    status, _, err = msgen("data", spec, corpus, "--tokenizer", bare, "-o", tmp_path / "d")
    assert status == 2 and "no EOS token" in err and "--eos" in err
    assert not (tmp_path / "d").exists()
    status, _, err = msgen(
        "data", spec, corpus, "--tokenizer", bare, "--eos", "<|sep|>", "-o", tmp_path / "d"
    )
    assert status == 0, err
    assert json.loads((tmp_path / "d" / "dataset.json").read_text())["eos"] == "<|sep|>"


def test_invalid_utf8_is_counted_not_fatal(spec, tmp_path, tokenizer_file):
    docs = docs_small()
    good = write_jsonl(tmp_path / "good.jsonl", docs)
    lines = good.read_bytes().splitlines(keepends=True)
    bad_line = b'{"text": "caf\xe9 au lait"}\n'  # Latin-1, not UTF-8
    offset = sum(map(len, lines[:3])) + bad_line.index(b"\xe9")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(b"".join(lines[:3]) + bad_line + b"not json\n" + b"".join(lines[3:]))
    text = tmp_path / "notes.txt"
    text.write_bytes(b"fine\n\nbroken \xff here\n\nfine again\n")
    out = tmp_path / "data"
    args = ("data", spec, corpus, text, "--paragraphs", "--tokenizer", tokenizer_file, "-o", out)
    status, _, err = msgen(*args)
    assert status == 0, err
    warn = "warning[MSL603]:"
    assert f"{corpus}:4:1: {warn} invalid UTF-8 at byte {offset}, document skipped" in err
    assert f"{corpus}:5:1: {warn} not JSON, document skipped" in err
    assert f"{text}:3:1: {warn} invalid UTF-8 at byte 13, document skipped" in err
    meta = json.loads((out / "dataset.json").read_text())
    assert meta["counts"]["skipped"] == {"invalid UTF-8": 2, "not JSON": 1}
    assert meta["counts"]["documents"] == len(docs) + 2


@pytest.mark.parametrize(
    "args, message",
    [
        (["--overlap", "33"], "--overlap 33 is out of range"),
        (["--valid", "1.5"], "--valid 1.5 is out of range"),
        ([], "no tokenizer"),
        (["--train-tokenizer", "--eos", "x"], "--eos: a trained tokenizer's EOS"),
    ],
)
def test_bad_flags_are_usage_errors(spec, tmp_path, args, message):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", ["text"])
    if args and args[0] in ("--overlap", "--valid"):
        args = [*args, "--train-tokenizer"]
    status, _, err = msgen("data", spec, corpus, *args, "-o", tmp_path / "d")
    assert status == 2 and message in err and "Traceback" not in err


def test_unknown_inputs_are_usage_errors(spec, tmp_path):
    (tmp_path / "corpus.csv").write_text("a,b\n")
    status, _, err = msgen("data", spec, tmp_path / "corpus.csv", "--train-tokenizer")
    assert status == 2 and "cannot tell what kind of file" in err
    status, _, err = msgen("data", spec, tmp_path / "missing.jsonl", "--train-tokenizer")
    assert status == 2 and "no such input file" in err
    parquet = tmp_path / "p.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["x"]}), parquet)
    status, _, err = msgen("data", spec, parquet, "--train-tokenizer")
    assert status == 2 and "has no column `text`" in err and "its columns: body" in err


def test_existing_dataset_needs_force(spec, tmp_path, tokenizer_file):
    corpus = write_jsonl(tmp_path / "corpus.jsonl", english())
    out = tmp_path / "data"
    out.mkdir()
    (out / "notes.md").write_text("mine")
    base = ("data", spec, corpus, "--tokenizer", tokenizer_file, "-o", out)
    assert msgen(*base, "--valid", "0.1")[0] == 0
    first = (out / "dataset.json").read_bytes()
    status, _, err = msgen(*base)
    assert status == 2 and "already holds a dataset" in err and "--force" in err
    assert (out / "dataset.json").read_bytes() == first
    status, _, err = msgen(*base, "--force")
    assert status == 0, err
    assert sorted(p.name for p in out.iterdir()) == sorted(DATA_FILES + ["notes.md"])
    assert json.loads((out / "dataset.json").read_text())["valid_fraction"] is None


@pytest.mark.parametrize("previous", [False, True])
def test_ctrl_c_leaves_no_partial_dataset(spec, tmp_path, tokenizer_file, previous):
    """Interrupted while writing: the folder holds what it held before, nothing else."""
    big = write_jsonl(tmp_path / "big.jsonl", (english() + chinese()) * 8)
    out = tmp_path / "data"
    if previous:
        small = write_jsonl(tmp_path / "small.jsonl", english())
        assert msgen("data", spec, small, "--tokenizer", tokenizer_file, "-o", out)[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()} if previous else None
    args = ["data", spec, big, "--tokenizer", tokenizer_file, "-o", out, "--force"]
    proc = run_subprocess(args, tmp_path, "0")
    deadline = time.monotonic() + 120
    while not any(out.glob(".msgen-data-*/train-*.mindrecord")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    if previous:
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    else:
        assert not out.exists()


def test_spec_errors_stop_before_data(tmp_path):
    spec = write_spec(tmp_path / "spec", "    eval_every   = 10\n")
    corpus = write_jsonl(tmp_path / "corpus.jsonl", ["text"])
    status, _, err = msgen("data", spec, corpus, "--train-tokenizer", "-o", tmp_path / "d")
    assert status == 1 and "error[MSL513]" in err and not (tmp_path / "d").exists()


def test_vocab_error_as_json(tmp_path, tokenizer_file):
    spec = write_spec(tmp_path / "spec", vocab=384)
    corpus = write_jsonl(tmp_path / "corpus.jsonl", ["text"])
    args = ("data", spec, corpus, "--tokenizer", tokenizer_file, "--error-format", "json")
    status, _, err = msgen(*args)
    (line,) = err.splitlines()
    d = json.loads(line)
    assert (
        status == 1 and d["code"] == "MSL601" and d["line"] == 7 and d["file"].endswith("tiny.msl")
    )


def test_progress_line_gives_the_phase_total_and_time_left(capsys):
    from msgen.data.progress import Progress

    progress = Progress("msgen data", total=10_000_000, enabled=True)
    progress.phase("tokenizing")
    progress.start -= 2  # two seconds into the phase
    progress.last -= 1  # the last redraw a second ago
    progress.update(4_000_000, 40, 1_000_000)
    progress.done()
    err = capsys.readouterr().err
    # 4 MB in 2 s is 2 MB/s; the 6 MB to go take 3 s
    line = "msgen data: tokenizing 4.0 of 10.0 MB (40%), 40 documents, 1.0 M tokens, 2.0 MB/s, 3 s left"
    assert line in err
    quiet = Progress("x", 10, enabled=False)
    quiet.phase("tokenizing")
    quiet.last -= 1
    quiet.update(1, 1)
    assert capsys.readouterr().err == ""


def test_progress_of_a_run_names_each_phase_and_the_input_size(spec, tmp_path):
    from msgen.compiler import analyze
    from msgen.data.command import DataOptions, data_command

    corpus = write_jsonl(tmp_path / "corpus.jsonl", english())
    size = corpus.stat().st_size
    options = DataOptions(
        inputs=(corpus,), output=tmp_path / "d", train_tokenizer=True, progress=True
    )
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        assert data_command(analyze(spec, []), options) == []
    err = stderr.getvalue()
    # read twice, once to sample for the tokenizer, once to write: each phase reads it
    # all, unit by unit (here one)
    total = f"of {size / 1e6:,.1f} MB"
    assert f"msgen data: sampling for the tokenizer 0.0 {total} (0%), 0 of 1 units" in err
    assert f"msgen data: sampling for the tokenizer {size / 1e6:,.1f} {total} (100%)" in err
    assert f"msgen data: tokenizing 0.0 {total} (0%), 0 of 1 units" in err
    assert f"msgen data: tokenizing {size / 1e6:,.1f} {total} (100%), 1 of 1 units" in err


# bounded reading ----------------------------------------------------------------


@settings(deadline=None)  # a loaded machine
@given(
    text=st.text(st.sampled_from("ab \n\u00e9\u4f60\U0001f600"), max_size=300),
    limit=st.integers(8, 40),
    chunk=st.integers(1, 9),
    paragraphs=st.booleans(),
)
def test_long_text_is_cut_into_documents_that_join_back(text, limit, chunk, paragraphs):
    """Cut at MAX_DOCUMENT bytes (here a few), read CHUNK bytes at a time: the pieces
    are whole UTF-8, each at most the limit, and together the text (the blank lines
    between paragraphs aside)."""
    from msgen.data import readers
    from msgen.data.sources import Source

    data = text.encode("utf-8")
    old = readers.MAX_DOCUMENT, readers.CHUNK
    readers.MAX_DOCUMENT, readers.CHUNK = limit, chunk
    try:
        docs = list(readers.read_text(Source(Path("t.txt"), "text", paragraphs=paragraphs),
                                      io.BytesIO(data)))  # fmt: skip
    finally:
        readers.MAX_DOCUMENT, readers.CHUNK = old
    assert all(isinstance(d, readers.Document) for d in docs)
    assert all(len(d.text.encode("utf-8")) <= limit for d in docs)
    if paragraphs:  # blank lines go: what is not white space stays, in order

        def ink(s: str) -> str:
            return s.replace(" ", "").replace("\n", "")

        assert ink("".join(d.text for d in docs)) == ink(text)
    else:
        assert "".join(d.text for d in docs) == text


@settings(deadline=None)
@given(text=st.text(st.sampled_from("ab \n\u00e9"), max_size=2000), piece=st.integers(4, 64))
def test_a_document_goes_to_the_tokenizer_in_pieces_that_join_back(text, piece):
    from msgen.data import work

    old, work.PIECE = work.PIECE, piece
    try:
        parts = list(work.pieces(text))
    finally:
        work.PIECE = old
    assert "".join(parts) == text and all(len(p) <= piece for p in parts)
