"""The syntax tree's nodes compare, hash and print as frozen dataclasses do (msgen's
Node writes those once for every node class instead of generating them per class)."""

from __future__ import annotations

import dataclasses

import pytest

from msgen.diagnostics import Span
from msgen.syntax import ast, parse

SPAN = Span(file="m.msl", line=1, col=1, end_line=1, end_col=2)
OTHER = Span(file="m.msl", line=2, col=1, end_line=2, end_col=2)


def test_every_node_class_is_a_frozen_dataclass_of_node():
    classes = [c for c in vars(ast).values() if isinstance(c, type) and issubclass(c, ast.Node)]
    assert len(classes) == 20
    for cls in classes:
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen
    name = ast.Name(SPAN, "x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        name.name = "y"


def test_equal_fields_make_equal_nodes_of_one_class_only():
    assert ast.Name(SPAN, "x") == ast.Name(SPAN, "x")
    assert hash(ast.Name(SPAN, "x")) == hash(ast.Name(SPAN, "x"))
    assert ast.Name(SPAN, "x") != ast.Name(SPAN, "y")
    assert ast.Name(SPAN, "x") != ast.Name(OTHER, "x")
    # same fields, another class: never equal (as dataclasses compare)
    assert ast.Name(SPAN, "x") != ast.String(SPAN, "x")
    assert ast.Name(SPAN, "x") != (SPAN, "x")
    assert len({ast.Name(SPAN, "x"), ast.Name(SPAN, "x"), ast.Name(SPAN, "y")}) == 2


def test_repr_names_the_class_and_every_field():
    number = ast.Number(SPAN, 3, "3")
    assert repr(number) == f"Number(span={SPAN!r}, value=3, text='3')"
    neg = ast.Neg(SPAN, number)
    assert repr(neg) == f"Neg(span={SPAN!r}, operand={number!r})"


def test_parses_of_one_text_are_equal_and_of_another_not():
    text = "model m {\n    x = f(a, [1, 2])  # note\n}\n"
    first, _ = parse(text, "m.msl")
    again, _ = parse(text, "m.msl")
    changed, _ = parse(text.replace("2]", "3]"), "m.msl")
    assert first == again and hash(first) == hash(again)
    assert first != changed
