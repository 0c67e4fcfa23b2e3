"""Render diagnostics: text with a caret under the span, JSON lines, or GitHub annotations."""

from __future__ import annotations

import json

from msgen.diagnostics import Diagnostic

FORMATS = ("text", "json", "github")


def render_text(d: Diagnostic, sources: dict[str, str]) -> str:
    head = f"{d.severity.value}[{d.code}]: {d.message}"
    if d.span is None:
        lines = [head]
    else:
        lines = [f"{d.span.file}:{d.span.line}:{d.span.col}: {head}"]
        # only the file the span is in: a --set what-if has no source lines here
        text_lines = sources.get(d.span.file, "").splitlines()
        if 0 < d.span.line <= len(text_lines):
            code = text_lines[d.span.line - 1]
            gutter = f"{d.span.line:>5}"
            end = d.span.end_col if d.span.end_line == d.span.line else len(code) + 1
            width = max(1, end - d.span.col)
            lines.append(f"{gutter} | {code}")
            lines.append(f"{' ' * len(gutter)} | {' ' * (d.span.col - 1)}{'^' * width}")
    if d.hint:
        pad = " " * len("   = hint: ")
        hint = d.hint.replace("\n", "\n" + pad)
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


def _escape(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    """A `key=value` property of a workflow command: also `:` and `,` are escaped."""
    return _escape(text).replace(":", "%3A").replace(",", "%2C")


def render_github(d: Diagnostic) -> str:
    level = "error" if d.is_error else "warning"
    message = d.message + (f" (hint: {d.hint})" if d.hint else "")
    if d.span is None:
        return f"::{level} title={d.code}::{_escape(message)}"
    s = d.span
    loc = (
        f"file={_escape_property(s.file)},line={s.line},col={s.col},"
        f"endLine={s.end_line},endColumn={s.end_col}"
    )
    return f"::{level} {loc},title={d.code}::{_escape(message)}"


def render(diags: list[Diagnostic], fmt: str, sources: dict[str, str]) -> str:
    """`sources` maps a file name, as spans give it, to its text."""
    if fmt == "json":
        return "".join(render_json(d) + "\n" for d in diags)
    if fmt == "github":
        return "".join(render_github(d) + "\n" for d in diags)
    return "".join(render_text(d, sources) + "\n" for d in diags)


def sort_key(d: Diagnostic):
    s = d.span
    return (s.file, s.line, s.col) if s else ("", 0, 0)
