"""The grammar's LALR tables as a Python module (msgen/syntax/msl_tables.py), so that
a run loads them instead of having lark analyse the grammar each time.

The module holds lark's own serialization of the built parser (what `Lark.save`
pickles, without the options that are code) as a literal. lark numbers states and
tokens in an order that differs between processes, so two generations of one grammar
differ in their bytes but not in what they parse.
"""

from __future__ import annotations

import pprint

import lark
from lark.grammar import Rule
from lark.lexer import TerminalDef

from msgen.syntax.parser import build_parser, code_options, grammar_sha256

HEADER = '''"""Generated from grammar/msl.lark by `python -m msgen.commands.tables` (make tables).
DO NOT EDIT: edit the grammar and regenerate. Until then msgen builds the parser from
the grammar (GRAMMAR_SHA256 no longer matches it)."""

# fmt: off
'''


def render(source: bytes) -> str:
    """The text of the tables module for the grammar `source`."""
    data, memo = build_parser(source).memo_serialize([TerminalDef, Rule])
    code = code_options()
    data["options"] = {k: v for k, v in data["options"].items() if k not in code}

    def literal(value) -> str:
        return pprint.pformat(value, width=100, compact=True, sort_dicts=False)

    return (
        HEADER
        + f"GRAMMAR_SHA256 = {grammar_sha256(source)!r}\n"
        + f"LARK = {lark.__version__!r}\n"
        + f"DATA = {literal(data)}\n"
        + f"MEMO = {literal(memo)}\n"
    )
