"""A DiffReport as text for a terminal, or as Markdown for a pull-request comment:
the verdict first, then a section per area that changed (collapsible in Markdown),
tables with their numbers aligned."""

from __future__ import annotations

import html
import json
import re

from msgen.review.model import DiffReport
from msgen.review.sections import Table, sections


def _widths(table: Table, cells: list[tuple[str, ...]]) -> list[int]:
    return [max(len(row[i]) for row in cells) for i in range(len(table.heads))]


def _pad(cell: str, width: int, kind: str) -> str:
    return cell.rjust(width) if kind == "n" else cell.ljust(width)


def text_table(table: Table) -> list[str]:
    cells = [table.heads, *table.rows]
    widths = _widths(table, cells)
    return [
        "  "
        + "  ".join(
            _pad(c, w, k) for c, w, k in zip(row, widths, table.kinds, strict=True)
        ).rstrip()
        for row in cells
    ]


def render_text(report: DiffReport) -> str:
    lines = [f"msgen diff {report.old.label} → {report.new.label}", report.verdict]
    for section in sections(report):
        lines += ["", f"{section.title} ({section.summary}):"]
        for i, table in enumerate(section.tables):
            lines += ([""] if i else []) + text_table(table)
    lines += [f"note: {note}" for note in report.notes]
    return "\n".join(lines) + "\n"


def escape(text: str) -> str:
    """Text Markdown shows as written: its punctuation that could start emphasis, a
    link, code or HTML backslashed."""
    return re.sub(r"([\\`*_\[\]<>|])", r"\\\1", text)


def code(text: str) -> str:
    """Text verbatim in a code span (a pattern's `*` is no emphasis)."""
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _cell(text: str, kind: str) -> str:
    """A table cell: code in a code span, other text escaped; a pipe escaped in both,
    as GitHub's tables need."""
    if kind != "c" or text == "—":
        return escape(text)
    return code(text).replace("|", "\\|")


def markdown_table(table: Table) -> list[str]:
    body = [tuple(_cell(c, k) for c, k in zip(row, table.kinds, strict=True)) for row in table.rows]
    cells = [table.heads, *body]
    widths = [max(w, 3) for w in _widths(table, cells)]
    rule = tuple(("-" * (w - 1) + ":") if k == "n" else (":" + "-" * (w - 1))
                 for w, k in zip(widths, table.kinds, strict=True))  # fmt: skip
    return [
        "| "
        + " | ".join(_pad(c, w, k) for c, w, k in zip(row, widths, table.kinds, strict=True))
        + " |"
        for row in (table.heads, rule, *body)
    ]


def render_markdown(report: DiffReport) -> str:
    lines = [
        f"### msgen diff {code(report.old.label)} → {code(report.new.label)}",
        "",
        f"**{escape(report.verdict)}**",
    ]
    for section in sections(report):
        summary = html.escape(f"{section.title}: {section.summary}", quote=False)
        lines += ["", f"<details><summary>{summary}</summary>"]
        for table in section.tables:
            lines += ["", *markdown_table(table)]
        lines += ["", "</details>"]
    if report.notes:
        lines += [""] + [f"> {escape(note)}" for note in report.notes]
    return "\n".join(lines) + "\n"


def render_json(report: DiffReport) -> str:
    return json.dumps(report.model_dump(mode="json"), indent=2, ensure_ascii=False) + "\n"
