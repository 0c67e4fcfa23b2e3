"""Corpora, specs and readers for the `msgen data` tests.

The corpus is text nobody here wrote: the English help topics CPython ships
(`pydoc_data/topics.py`) and the Chinese Vim tutor in tests/data/ (full-width
punctuation that NFKC folds). Specs are specs/tiny.msl with a vocab a byte-level BPE
fits in (512: the 256 bytes, EOS and merges).
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "specs" / "tiny.msl"
ZH = ROOT / "tests" / "data" / "vimtutor_zh_cn.txt"
VOCAB = 512


def english() -> list[str]:
    from pydoc_data.topics import topics

    return [topics[name] for name in sorted(topics)]


def chinese() -> list[str]:
    """The tutor's blank-line-separated blocks."""
    text = ZH.read_text(encoding="utf-8")
    return [block for block in text.split("\n\n") if block.strip()]


def write_jsonl(path: Path, docs: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    return path


# tiny's mesh without its pipeline (dp 4, tp 2, pp 1; 2 micro-batches keep the global
# batch of 8): a validation set needs pp = 1 (MSL514)
NO_PIPELINE = (
    ("    dp = 2\n", "    dp = 4\n"),
    ("    pp = 2 ", "    pp = 1 "),
    ("    micro_batches = 4 ", "    micro_batches = 2 "),
)


def write_spec(
    folder: Path, train_lines: str = "", vocab: int = VOCAB, pipeline: bool = True
) -> Path:
    """specs/tiny.msl with `vocab` and extra lines at the end of its train block; without
    its pipeline stages when not `pipeline`."""
    folder.mkdir(parents=True, exist_ok=True)
    text = TINY.read_text(encoding="utf-8").replace("vocab  = 256", f"vocab  = {vocab}")
    for old, new in () if pipeline else NO_PIPELINE:
        assert old in text
        text = text.replace(old, new)
    last = "    seed         = 1234          # no data: only --synthetic runs\n"
    assert last in text
    text = text.replace(last, last + train_lines)
    shutil.copy(TINY.parent / "hccn.conf", folder / "hccn.conf")
    spec = folder / "tiny.msl"
    spec.write_text(text, encoding="utf-8")
    return spec


def msgen(*args: str) -> tuple[int, str, str]:
    """`msgen ARGS` in-process: (exit status, stdout, stderr)."""
    from msgen.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main([str(a) for a in args])
    return status, out.getvalue(), err.getvalue()


def read_windows(path: Path) -> np.ndarray:
    """The `input_ids` of every sample of a MindRecord file, in file order."""
    from mindspore.mindrecord import FileReader

    reader = FileReader(str(path))
    try:
        rows = [row["input_ids"] for row in reader.get_next()]
    finally:
        reader.close()
    return np.stack(rows) if rows else np.empty((0, 0), np.int32)


def read_set(folder: Path, name: str = "train") -> np.ndarray:
    """The windows of a set of a dataset msgen data wrote: its files, in the order
    dataset.json lists them."""
    files = json.loads((folder / "dataset.json").read_text())["files"][name]
    return np.concatenate([read_windows(folder / f) for f in files])
