"""msgen/base/readers.py: JSON from outside msgen, every lie in it refused as one line
naming the file and the key (BadInput, status 2), never a traceback, in bounded
work; and what is well formed returned as it is."""

from __future__ import annotations

import json
import os

import pytest

from msgen.base.readers import (
    MAX_DEPTH,
    BadInput,
    Bool,
    Dict,
    Int,
    List,
    Nullable,
    Num,
    Obj,
    Str,
    depth,
    load_json,
    parse_json,
)
from msgen.base.status import UsageError

RUN = Obj(
    required={"world": Int(1, 1 << 20), "spec": Obj(required={"path": Str()})},
    optional={"lr": Num(0), "tags": List(Str(), max_len=4), "ok": Bool(), "note": Nullable(Str())},
)


def refused(text: str, schema=RUN) -> str:
    with pytest.raises(BadInput) as caught:
        parse_json(text, "run.json", schema)
    assert isinstance(caught.value, UsageError)  # the command line's status 2
    return str(caught.value)


def test_a_well_formed_document_comes_back_as_it_was():
    doc = {"world": 8, "spec": {"path": "a.msl"}, "lr": 3e-4, "tags": ["x"], "note": None}
    assert parse_json(json.dumps(doc), "run.json", RUN) == doc


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"world": "8", "spec": {"path": "a"}}', "run.json: world: expected an integer, got a string"),
        ('{"world": true, "spec": {"path": "a"}}', "run.json: world: expected an integer, got a boolean"),
        ('{"world": 100000000, "spec": {"path": "a"}}', "run.json: world: 100000000 is outside 1..1048576"),
        ('{"world": 8}', "run.json: spec: missing"),
        ('{"world": 8, "spec": {"path": ["a"]}}', "run.json: spec.path: expected a string, got a list"),
        ('{"world": 8, "spec": {"path": "a"}, "tags": [1]}', "run.json: tags[0]: expected a string, got an integer"),
        ('{"world": 8, "spec": {"path": "a"}, "tags": ["a","b","c","d","e"]}', "run.json: tags: 5 entries, at most 4"),
        ('[1, 2]', "run.json: expected an object, got a list"),
        ('{"world": 8, "spec": {"path": "a"}, "lr": -1}', "run.json: lr: -1 is outside 0..None"),
    ],
)  # fmt: skip
def test_a_value_of_the_wrong_type_or_size_names_its_key(text, message):
    assert refused(text) == message


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"world": ' + "9" * 400 + "}", "an integer of 400 digits"),
        ('{"world": ' + "9" * 5000 + "}", "an integer of 5000 digits"),
        ('{"lr": NaN}', "NaN is not JSON"),
        ('{"lr": -Infinity}', "-Infinity is not JSON"),
        ('{"lr": 1e999}', "1e999 is not a finite number"),
        ('{"world": 8,', "not JSON (Expecting property name enclosed in double quotes"),
    ],
)
def test_numbers_no_count_can_be_and_broken_text_are_refused(text, message):
    assert message in refused(text)


def test_nesting_is_refused_before_json_recurses():
    """Python's json recurses once per level; 100,000 levels is a RecursionError
    there, one line here."""
    assert refused("[" * 100_000 + "]" * 100_000) == (
        f"run.json: nested deeper than {MAX_DEPTH} levels"
    )
    assert depth('{"a": "[[[[", "b": [[1]], "c": "\\"]"}') == 3  # brackets in strings skipped


def test_keys_and_file_names_are_quoted_printably():
    """A key carrying a terminal escape is shown escaped, not acted on."""
    message = refused('{"world": 8, "spec": {"path": "a"}, "x": {"\\u001b[2J": "v"}}', Obj(
        required={"x": Dict(Int())}
    ))  # fmt: skip
    assert "\x1b" not in message and "x.\\x1b[2J: expected an integer" in message


def test_a_file_is_read_only_when_it_is_a_regular_file_within_its_limit(tmp_path):
    good = tmp_path / "run.json"
    good.write_text('{"world": 2, "spec": {"path": "a"}}')
    assert load_json(good, 1024, RUN)["world"] == 2
    with pytest.raises(BadInput, match="larger than"):
        load_json(good, 8, RUN)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # never waited on
    with pytest.raises(BadInput, match="not a regular file"):
        load_json(fifo, 1024)
    (tmp_path / "bad.json").write_bytes(b'{"a": "\xff"}')
    with pytest.raises(BadInput, match="not UTF-8"):
        load_json(tmp_path / "bad.json", 1024)
    with pytest.raises(BadInput, match="cannot read .*missing.json"):
        load_json(tmp_path / "missing.json", 1024)
