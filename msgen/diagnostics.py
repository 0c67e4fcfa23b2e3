"""Source spans and diagnostics: what every stage returns instead of raising."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from pydantic import BaseModel, ConfigDict


@dataclass(frozen=True)
class Span:
    """A region of a spec file; lines and columns are 1-based, end column exclusive."""

    file: str
    line: int
    col: int
    end_line: int
    end_col: int

    def to(self, other: Span) -> Span:
        """The span from the start of this one to the end of `other`."""
        return replace(self, end_line=other.end_line, end_col=other.end_col)

    def first(self, width: int) -> Span:
        """The first `width` columns of the span, on its first line."""
        return replace(self, end_line=self.line, end_col=self.col + width)


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"


class Diagnostic(BaseModel):
    # validator built on first use: checking a clean spec makes no diagnostic
    model_config = ConfigDict(frozen=True, defer_build=True)

    code: str
    severity: Severity
    message: str
    span: Span | None = None
    hint: str | None = None

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR


def error(code: str, message: str, span: Span | None, hint: str | None = None) -> Diagnostic:
    return Diagnostic(code=code, severity=Severity.ERROR, message=message, span=span, hint=hint)


def warning(code: str, message: str, span: Span | None, hint: str | None = None) -> Diagnostic:
    return Diagnostic(code=code, severity=Severity.WARNING, message=message, span=span, hint=hint)


def has_errors(diagnostics: list[Diagnostic]) -> bool:
    return any(d.is_error for d in diagnostics)


def printable(text: str, keep: str = "") -> str:
    """`text` with every character a terminal or a source file would act on (control
    characters such as ESC and CR, line and paragraph separators, the lone surrogates
    that stand for undecodable bytes in a file name) written as its Python escape.
    Printable text, the ordinary case, comes back unchanged; so do the characters
    in `keep` (a message's own line breaks)."""
    if text.isprintable():
        return text
    return "".join(
        c if c.isprintable() or c in keep else c.encode("unicode_escape").decode() for c in text
    )


def format_bytes(n: int) -> str:
    """A byte count for people: two decimals in the largest binary unit that fits."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def did_you_mean(name: str, candidates) -> str | None:
    """A hint naming the closest candidate, if one is close enough."""
    import difflib

    match = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.6)
    return f"did you mean `{match[0]}`?" if match else None
