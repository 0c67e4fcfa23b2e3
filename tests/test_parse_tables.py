"""The prebuilt LALR tables (msgen/syntax/msl_tables.py): they fit the committed
grammar, a parser loaded from them parses every spec msgen ships or tests (and
hundreds of mutated ones) exactly as a parser built from the grammar does, and an
edited grammar is used as written until the tables are regenerated."""

from __future__ import annotations

import random
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest

from msgen.commands import tables as tables_command
from msgen.syntax import ast, msl_tables, parse
from msgen.syntax import parser as parser_module
from msgen.syntax.parser import build_parser, grammar_source, parser_for, tables_fit
from msgen.syntax.tables import render
from tests.mutations import SPECS, mutate

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(
    [
        *ROOT.glob("specs/*.msl"),
        *ROOT.glob("tests/specs/*.msl"),
        *ROOT.glob("tests/cases/**/*.msl"),
        *ROOT.glob("tests/fmt_cases/*/*.msl"),
    ]
)
# A grammar edit that changes what parses: the keyword `every` becomes `each`.
EVERY = b'EVERY: "every"'
EACH = b'EVERY: "each"'
EACH_SPEC = "train {\n    checkpoint = each 100 keep 3\n}\n"


def module_of(text: str) -> ModuleType:
    module = ModuleType("msl_tables_under_test")
    exec(compile(text, "msl_tables_under_test", "exec"), module.__dict__)
    return module


def parse_with(monkeypatch, lark_parser, text: str, file: str):
    monkeypatch.setattr(parser_module, "_parser", lambda: lark_parser)
    return parse(text, file)


def no_build(source: bytes):
    raise AssertionError("the parser was built from the grammar, not loaded")


def test_committed_tables_fit_the_grammar():
    # if this fails: `make tables` after editing grammar/msl.lark
    assert tables_fit(grammar_source(), msl_tables)


def test_fitting_tables_are_loaded_not_built(monkeypatch):
    monkeypatch.setattr(parser_module, "build_parser", no_build)
    loaded = parser_for(grammar_source(), msl_tables)
    module, diags = parse_with(monkeypatch, loaded, "version 1\nmesh {\n  tp = 2\n}\n", "m.msl")
    assert diags == [] and module.blocks[0].kind.name == "mesh"


@pytest.fixture(scope="module")
def parsers():
    source = grammar_source()
    return parser_for(source, msl_tables), build_parser(source)


def texts() -> list[tuple[str, str]]:
    out = [(p.relative_to(ROOT).as_posix(), p.read_text()) for p in SOURCES]
    rnd = random.Random(20240613)
    for name, text in SPECS.items():
        out += [(f"{name}~{i}", mutate(text, rnd)) for i in range(60)]
    return out


def test_loaded_tables_parse_as_the_grammar_does(monkeypatch, parsers):
    loaded, built = parsers
    cases = texts()
    assert len(SOURCES) > 100  # the specs, the golden cases, the fmt cases
    failed = 0
    for name, text in cases:
        got = parse_with(monkeypatch, loaded, text, name)
        want = parse_with(monkeypatch, built, text, name)
        assert got == want, name
        failed += got[0] is None
    # the comparison covers syntax errors as well as trees
    assert 0 < failed < len(cases)


def test_an_edited_grammar_is_built_until_regenerated(monkeypatch):
    edited = grammar_source().replace(EVERY, EACH)
    assert edited != grammar_source() and not tables_fit(edited, msl_tables)
    built = parser_for(edited, msl_tables)
    module, diags = parse_with(monkeypatch, built, EACH_SPEC, "t.msl")
    assert diags == [] and isinstance(module.blocks[0].stmts[0].value, ast.Every)
    _, diags = parse_with(monkeypatch, parser_for(grammar_source(), msl_tables), EACH_SPEC, "t.msl")
    assert [d.code for d in diags] == ["MSL001"]

    # regenerated tables fit the edited grammar and are what gets loaded
    regenerated = module_of(render(edited))
    assert tables_fit(edited, regenerated) and not tables_fit(grammar_source(), regenerated)
    monkeypatch.setattr(parser_module, "build_parser", no_build)
    loaded = parser_for(edited, regenerated)
    assert parse_with(monkeypatch, loaded, EACH_SPEC, "t.msl") == (module, [])


def test_tables_of_another_lark_are_not_loaded():
    other = SimpleNamespace(GRAMMAR_SHA256=msl_tables.GRAMMAR_SHA256, LARK="0.0.0")
    assert not tables_fit(grammar_source(), other)
    assert parser_for(grammar_source(), other).parse("version 1\n") is not None


def test_regenerating_fitting_tables_writes_nothing(capsys):
    before = tables_command.TABLES.read_bytes()
    assert tables_command.main([]) == 0
    assert "nothing written" in capsys.readouterr().out
    assert tables_command.TABLES.read_bytes() == before


def test_forced_regeneration_writes_tables_that_fit(monkeypatch, tmp_path, capsys):
    target = tmp_path / "msl_tables.py"
    monkeypatch.setattr(tables_command, "TABLES", target)
    assert tables_command.main(["--force"]) == 0
    assert capsys.readouterr().out == "wrote msl_tables.py\n"
    text = target.read_text()
    assert "DO NOT EDIT" in text.splitlines()[1]
    assert tables_fit(grammar_source(), module_of(text))
