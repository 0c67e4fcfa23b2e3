"""`.gz` inputs are one work unit each, however large (a gzip stream cannot be entered
at a byte offset; docs/data.md, "Work units and workers"): a gzipped corpus gives
the bytes its uncompressed copy gives when no file of that copy is split either,
on one worker and on two (and on Ray, in test_data_ray.py)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from tests.data_fixtures import chinese, english, msgen, write_jsonl
from tests.test_data_engines import files_of, spec_for, tokenizer_file

__all__ = ["tokenizer_file"]  # the fixture, shared


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> tuple[Path, Path, int]:
    """The same three files plain and gzipped (a large JSON Lines file, a small one,
    a text), and a unit size that would cut the large one into ranges, even gzipped."""
    plain = tmp_path_factory.mktemp("plain")
    docs = english() + chinese()
    write_jsonl(plain / "a.jsonl", docs[:5])
    write_jsonl(plain / "b.jsonl", docs[:60])
    (plain / "c.txt").write_text(docs[7], encoding="utf-8")
    zipped = tmp_path_factory.mktemp("gz")
    for path in plain.iterdir():
        with gzip.open(zipped / f"{path.name}.gz", "wb") as f:
            f.write(path.read_bytes())
    return plain, zipped, (zipped / "b.jsonl.gz").stat().st_size // 2 + 1


def written(tmp_path: Path, corpus: Path, tokenizer: Path, out: str, *flags) -> Path:
    folder = tmp_path / out
    status, _, err = msgen("data", spec_for(tmp_path), corpus, "--tokenizer", tokenizer,
                           "-o", folder, *flags)  # fmt: skip
    assert status == 0, err
    return folder


def data_files(folder: Path) -> dict[str, str]:
    """The MindRecord files and their indexes (dataset.json records the flags too)."""
    return {n: d for n, d in files_of(folder).items() if n != "dataset.json"}


def test_a_gz_is_one_unit_and_gives_its_uncompressed_copys_bytes(tmp_path, corpora,
                                                                 tokenizer_file):  # fmt: skip
    from msgen.data.sources import sources
    from msgen.data.units import plan

    plain, zipped, unit = corpora
    # plain, the large file is cut into ranges; gzipped, it is one unit
    assert len(plan(sources([plain], "text", False), unit)) > 5
    assert len(plan(sources([zipped], "text", False), unit)) == 3
    one = [written(tmp_path, zipped, tokenizer_file, f"gz{w}", "--unit-size", str(unit),
                   "--workers", w) for w in ("1", "2")]  # fmt: skip
    whole = written(tmp_path, plain, tokenizer_file, "whole", "--unit-size", "1M")
    # three units, one a .gz: three files and their indexes
    names = [f"train-{i:05d}.mindrecord{x}" for i in range(3) for x in ("", ".db")]
    assert sorted(data_files(one[0])) == names
    assert data_files(one[0]) == data_files(one[1]) == data_files(whole)
