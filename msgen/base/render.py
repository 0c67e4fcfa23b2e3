"""Render diagnostics: text with a caret under the span, JSON lines, or GitHub annotations
(every command and run tool prints its diagnostics through here)."""

from __future__ import annotations

import json
from collections import Counter
from functools import lru_cache

from msgen.diagnostics import Diagnostic, printable

FORMATS = ("text", "json", "github")


# A source line longer than this is shown as an excerpt around the span.
EXCERPT = 160
# Diagnostics of one code shown in text and GitHub formats; the rest are counted.
MAX_PER_CODE = 20


@lru_cache(maxsize=4)
def _lines(text: str) -> list[str]:
    """A source's lines as the lexer counts them (at \\n only), split once per
    source, not once per diagnostic (a str caches its hash, so the lookup is cheap)."""
    return text.split("\n")


def _excerpt(code: str, col: int, end: int) -> tuple[str, int, int]:
    """A window of at most EXCERPT characters of `code` around columns col..end
    (1-based, end exclusive), with `...` where it was cut; the span's new columns."""
    if len(code) <= EXCERPT:
        return code, col, end
    start = max(0, min(col - 1 - EXCERPT // 4, len(code) - EXCERPT))
    stop = start + EXCERPT
    shown = ("..." if start else "") + code[start:stop] + ("..." if stop < len(code) else "")
    shift = start - (3 if start else 0)
    return shown, col - shift, min(end, stop + 1) - shift


def render_text(d: Diagnostic, sources: dict[str, str]) -> str:
    head = f"{d.severity.value}[{d.code}]: {printable(d.message)}"
    if d.span is None:
        lines = [head]
    else:
        lines = [f"{printable(d.span.file)}:{d.span.line}:{d.span.col}: {head}"]
        # only the file the span is in: a --set what-if has no source lines here
        text_lines = _lines(sources.get(d.span.file, ""))
        if 0 < d.span.line <= len(text_lines) and (d.span.line < len(text_lines) or text_lines[-1]):
            code = text_lines[d.span.line - 1].removesuffix("\r")
            end = d.span.end_col if d.span.end_line == d.span.line else len(code) + 1
            code, col, end = _excerpt(code, d.span.col, end)
            # escapes widen what they replace: the caret goes under the escaped text
            pad = len(printable(code[: col - 1]))
            width = max(1, len(printable(code[col - 1 : end - 1])))
            gutter = f"{d.span.line:>5}"
            lines.append(f"{gutter} | {printable(code)}")
            lines.append(f"{' ' * len(gutter)} | {' ' * pad}{'^' * width}")
    if d.hint:
        pad = " " * len("   = hint: ")
        hint = printable(d.hint, keep="\n").replace("\n", "\n" + pad)
        lines.append(f"   = hint: {hint}")
    return "\n".join(lines)


def render_json(d: Diagnostic) -> str:
    s = d.span
    obj = {
        "code": d.code,
        "severity": d.severity.value,
        "message": d.message,
        "file": s.file if s else None,
        "line": s.line if s else None,
        "column": s.col if s else None,
        "end": {"line": s.end_line, "column": s.end_col} if s else None,
        "hint": d.hint,
    }
    return json.dumps(obj, sort_keys=True)


def escape_workflow(text: str) -> str:
    """Text for a GitHub workflow command's message: `%`, CR and LF escaped."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    """A `key=value` property of a workflow command: also `:` and `,` are escaped."""
    return escape_workflow(text).replace(":", "%3A").replace(",", "%2C")


def render_github(d: Diagnostic) -> str:
    level = "error" if d.is_error else "warning"
    message = d.message + (f" (hint: {d.hint})" if d.hint else "")
    if d.span is None:
        return f"::{level} title={d.code}::{escape_workflow(message)}"
    s = d.span
    loc = (
        f"file={_escape_property(s.file)},line={s.line},col={s.col},"
        f"endLine={s.end_line},endColumn={s.end_col}"
    )
    return f"::{level} {loc},title={d.code}::{escape_workflow(message)}"


def _capped(diags: list[Diagnostic]) -> tuple[list[Diagnostic], list[str]]:
    """The first MAX_PER_CODE diagnostics of each code, and a line for each code
    with more ("and 4990 more MSL507 warnings")."""
    seen: Counter[str] = Counter(d.code for d in diags)
    shown: Counter[str] = Counter()
    kept = []
    for d in diags:
        shown[d.code] += 1
        if shown[d.code] <= MAX_PER_CODE:
            kept.append(d)
    more = [
        f"... and {n - MAX_PER_CODE} more {code} diagnostics (--error-format json lists all)"
        for code, n in sorted(seen.items())
        if n > MAX_PER_CODE
    ]
    return kept, more


def render(diags: list[Diagnostic], fmt: str, sources: dict[str, str]) -> str:
    """`sources` maps a file name, as spans give it, to its text. JSON lists every
    diagnostic; text and GitHub show at most MAX_PER_CODE of each code."""
    if fmt == "json":
        return "".join(render_json(d) + "\n" for d in diags)
    diags, more = _capped(diags)
    if fmt == "github":
        notes = [f"::notice::{escape_workflow(line)}" for line in more]
        return "".join(render_github(d) + "\n" for d in diags) + "".join(n + "\n" for n in notes)
    return "".join(render_text(d, sources) + "\n" for d in diags) + "".join(m + "\n" for m in more)


def sort_key(d: Diagnostic):
    s = d.span
    return (s.file, s.line, s.col) if s else ("", 0, 0)
