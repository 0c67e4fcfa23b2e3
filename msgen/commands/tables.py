"""Regenerate the prebuilt parse tables (msgen/syntax/msl_tables.py) after the grammar
changed, for msgen's developers (`make tables`, part of `make generate`):

    python -m msgen.commands.tables [--force]

Tables that fit the grammar are left alone unless `--force`d: lark numbers them
differently each time, so rewriting fresh tables would only churn the file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from msgen.base.files import write_file
from msgen.base.status import EXIT_OK
from msgen.syntax import msl_tables
from msgen.syntax.parser import grammar_source, tables_fit
from msgen.syntax.tables import render

TABLES = Path(msl_tables.__file__)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="regenerate msgen's prebuilt parse tables")
    parser.add_argument("--force", action="store_true", help="rewrite tables that still fit")
    args = parser.parse_args(argv)
    source = grammar_source()
    if tables_fit(source, msl_tables) and not args.force:
        print(f"{TABLES.name} fits the grammar; nothing written")
        return EXIT_OK
    write_file(TABLES, render(source))
    print(f"wrote {TABLES.name}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
