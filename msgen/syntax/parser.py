"""Parse MSL text into the AST of `msgen.syntax.ast` (the tree converted by
msgen/syntax/to_ast.py), or into MSL0xx diagnostics."""

from __future__ import annotations

import gc
import hashlib
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import ModuleType

import lark
from lark import Lark, Token
from lark.exceptions import (
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    UnexpectedToken,
)

from msgen.base.files import read_regular
from msgen.diagnostics import Diagnostic, Span, error
from msgen.resources import resource_dir
from msgen.syntax import ast
from msgen.syntax.to_ast import Rejected, ToAst, token_span

OPENERS = {"LPAR", "LSQB"}
CLOSERS = {"RPAR", "RSQB"}
OPERATORS = {"PLUS", "MINUS", "STAR", "SLASH", "DOUBLESLASH"}

# How deep an expression may nest: brackets, plus the operators of the item each
# open bracket is in (a chain `a + b + c` nests one level per operator). Every
# stage after the parser walks the tree recursively, so a limit keeps them all far
# from Python's; real specs stay below 10.
MAX_NESTING = 100
# The largest spec file msgen reads (a 32-layer spec is about 4 KiB).
SPEC_LIMIT = 16 * 2**20

# How a terminal is named in a message.
TERMINAL_WORDS = {
    "NAME": "a name",
    "WORD": "a name",
    "NUMBER": "a number",
    "STRING": "a string",
    "UNIT": "a unit (GiB, MiB, ...)",
    "_NL": "end of line",
    "$END": "end of file",
    "INPUT": "`input`",
    "OUTPUT": "`output`",
    "REPEAT": "`repeat`",
    "EVERY": "`every`",
    "KEEP": "`keep`",
    "BUCKETS": "`buckets`",
    "EQUAL": "`=`",
    "COLON": "`:`",
    "COMMA": "`,`",
    "AT": "`@`",
    "PLUS": "`+`",
    "MINUS": "`-`",
    "STAR": "`*`",
    "SLASH": "`/`",
    "DOUBLESLASH": "`//`",
    "LPAR": "`(`",
    "RPAR": "`)`",
    "LSQB": "`[`",
    "RSQB": "`]`",
    "LBRACE": "`{`",
    "RBRACE": "`}`",
}


class _Statements:
    """Post-lexer: newlines inside () and [] are not statement ends, and runs of
    blank or comment lines are one newline. The file always ends in a newline.
    It also bounds how deep expressions nest (MAX_NESTING)."""

    always_accept = ("_NL",)

    def process(self, stream):
        tokens = _COLLECTED.get().tokens
        operators = [0]  # per open bracket (and the statement): operators in its item
        nesting = 0  # open brackets plus all of `operators`
        last = None
        for tok in stream:
            depth = len(operators) - 1
            if tok.type in OPENERS:
                operators.append(0)
                nesting += 1
            elif tok.type in CLOSERS:
                if depth:
                    nesting -= 1 + operators.pop()
            elif tok.type in OPERATORS:
                operators[-1] += 1
                nesting += 1
            elif tok.type == "COMMA":
                nesting -= operators[-1]
                operators[-1] = 0
            elif tok.type == "_NL" and (depth > 0 or last is None or last.type == "_NL"):
                continue
            elif tok.type == "_NL":
                nesting -= operators[0]
                operators[0] = 0
            if nesting > MAX_NESTING:
                raise Rejected(
                    (
                        "MSL005",
                        f"expression nested too deeply (more than {MAX_NESTING} levels)",
                        tok,
                        "split it with named dims, or write the value out",
                    )
                )
            last = tok
            if tok.type != "_NL":
                tokens.append((tok.line, tok.column, str(tok)))
            yield tok
        if last is not None and last.type != "_NL":
            yield Token.new_borrow_pos("_NL", "\n", last)


@dataclass
class _Collected:
    """What the lexer gives beside the tree: the comments (ignored by the grammar) and
    every other token but newlines, in source order."""

    comments: list[tuple[int, str]] = field(default_factory=list)
    tokens: list[tuple[int, int, str]] = field(default_factory=list)


# The one cached parser's lexer callback and post-lexer write to the collector of
# the parse in progress: a context variable, so parsing is reentrant and thread-safe.
_COLLECTED: ContextVar[_Collected] = ContextVar("msgen_parse")


def _comment(tok: Token) -> Token:
    _COLLECTED.get().comments.append((tok.line, str(tok)))
    return tok


# How the parser is built. Prebuilt tables (msgen/syntax/msl_tables.py) hold these
# options' result; what is code, not data, is given again when they are loaded.
LARK_OPTIONS = {
    "parser": "lalr",
    "lexer": "contextual",
    "propagate_positions": True,
    "maybe_placeholders": False,
}


def code_options() -> dict:
    """The options that are code: given when the parser is built or loaded, never
    stored in the tables."""
    return {"postlex": _Statements(), "lexer_callbacks": {"COMMENT": _comment}}


def grammar_source() -> bytes:
    return (resource_dir("grammar") / "msl.lark").read_bytes()


def grammar_sha256(source: bytes) -> str:
    return hashlib.sha256(source).hexdigest()


def build_parser(source: bytes) -> Lark:
    """The parser built from the grammar: lark analyses it and makes the LALR tables."""
    return Lark(source.decode("utf-8"), **LARK_OPTIONS, **code_options())


def tables_fit(source: bytes, tables: ModuleType) -> bool:
    """Whether prebuilt tables were made from this grammar by this lark."""
    return tables.GRAMMAR_SHA256 == grammar_sha256(source) and tables.LARK == lark.__version__


def parser_for(source: bytes, tables: ModuleType) -> Lark:
    """The parser from prebuilt tables when they fit the grammar (a tenth of the time
    of building it), else built from the grammar (as after an edit to it)."""
    if not tables_fit(source, tables):
        return build_parser(source)
    # lark's own cache loads its tables this way (lark.Lark.__init__ with cache=True).
    return Lark._load_from_dict(tables.DATA, tables.MEMO, **code_options())


@lru_cache(maxsize=1)
def _parser() -> Lark:
    from msgen.syntax import msl_tables

    return parser_for(grammar_source(), msl_tables)


def _expected(exc: UnexpectedInput) -> str:
    names = sorted({TERMINAL_WORDS.get(t, t) for t in getattr(exc, "expected", ()) or ()})
    if not names:
        return ""
    if len(names) > 6:
        names = names[:6] + ["..."]
    return "expected " + ", ".join(names)


def _syntax_error(exc: UnexpectedInput, file: str, text: str) -> Diagnostic:
    line = getattr(exc, "line", 1) or 1
    col = getattr(exc, "column", 1) or 1
    if isinstance(exc, UnexpectedCharacters):
        char = text[exc.pos_in_stream] if exc.pos_in_stream < len(text) else ""
        span = Span(file=file, line=line, col=col, end_line=line, end_col=col + 1)
        hint = "names are letters, digits and `_`; comments start with `#`"
        if char == '"':
            hint = "a string must close on the same line"
        return error("MSL002", f"unexpected character {char!r}", span, hint)
    if isinstance(exc, UnexpectedEOF) or (
        isinstance(exc, UnexpectedToken) and exc.token.type == "$END"
    ):
        lines = text[:-1].split("\n")  # lines as the lexer counts them: at \n only
        last = len(lines)
        span = Span(file=file, line=last, col=1, end_line=last, end_col=max(2, len(lines[-1]) + 1))
        return error(
            "MSL003",
            "unexpected end of file",
            span,
            "a block or bracket is not closed; " + _expected(exc),
        )
    tok = exc.token
    if tok.type == "_NL":
        span = Span(
            file=file, line=tok.line, col=tok.column, end_line=tok.line, end_col=tok.column + 1
        )
        what = "end of line"
    else:
        span = token_span(file, tok)
        what = f"`{tok}`"
    return error("MSL001", f"unexpected {what}", span, _expected(exc) or None)


def read_source(path: Path) -> str:
    """A spec's text exactly as its bytes say, for every command alike: no newline
    translation (so `\\r\\n` stays as written, and a lone `\\r` is seen, not made a
    line break). Raises OSError or UnicodeDecodeError."""
    return read_regular(path, SPEC_LIMIT).decode("utf-8")


def _lone_cr(text: str, file: str) -> Diagnostic | None:
    """A carriage return not followed by a newline. Editors and terminals show it
    as a line break, the lexer does not (it would hide the rest of a comment line's
    text, or put it there), so it is refused wherever it is."""
    at = next((i for i, ch in enumerate(text) if ch == "\r" and text[i + 1 : i + 2] != "\n"), None)
    if at is None:
        return None
    line = text.count("\n", 0, at) + 1
    col = at - (text.rfind("\n", 0, at) + 1) + 1
    span = Span(file=file, line=line, col=col, end_line=line, end_col=col + 1)
    return error(
        "MSL002",
        "unexpected character '\\r' (a carriage return without a newline)",
        span,
        "lines end in \\n or \\r\\n; delete the lone carriage return",
    )


def _rejected(exc: Rejected, file: str) -> Diagnostic:
    code, message, tok, hint = exc.args_
    return error(code, message, token_span(file, tok), hint)


def parse(text: str, file: str = "<spec>") -> tuple[ast.Module | None, list[Diagnostic]]:
    """Parse a whole spec. Returns the module, or None and the syntax error."""
    parser = _parser()
    collected = _Collected()
    context = _COLLECTED.set(collected)
    if not text.endswith("\n"):
        text += "\n"
    if "\r" in text and (cr := _lone_cr(text, file)) is not None:
        return None, [cr]
    # The parse makes a tree and an AST of small objects, and no cycles: the cyclic
    # collector, run over them again and again as they pile up, made a 16 MiB spec's
    # parse grow faster than its size (bench/bench_check_scale.py). Paused meanwhile.
    collecting = gc.isenabled()
    gc.disable()
    try:
        tree = parser.parse(text)
        module = ToAst(file).transform(tree)
    except UnexpectedInput as exc:
        return None, [_syntax_error(exc, file, text)]
    except Rejected as exc:
        return None, [_rejected(exc, file)]
    finally:
        _COLLECTED.reset(context)
        if collecting:
            gc.enable()
    return (
        ast.Module(
            module.span,
            module.version,
            module.blocks,
            tuple(collected.comments),
            tuple(collected.tokens),
        ),
        [],
    )
