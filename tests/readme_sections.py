"""The commands a README section prints (its indented lines), for the tests that run
them as printed."""

from __future__ import annotations

from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def section_commands(title: str) -> list[str]:
    """The indented lines of README's section `## <title>`, in order."""
    readme = README.read_text(encoding="utf-8")
    start = readme.index(f"## {title}")
    section = readme[start : readme.index("\n## ", start + 1)]
    return [line.strip() for line in section.splitlines() if line.startswith("    ")]
