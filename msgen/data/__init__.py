"""`msgen data`: raw text to the tokenized, packed MindRecord a generated train.py reads.

Only this package imports tokenizers, pyarrow and MindSpore, and only when the
command runs: `import msgen` stays free of all three.
"""

from __future__ import annotations


class DataError(Exception):
    """Bad input to `msgen data` (a flag, a file, the output folder): one line and a hint."""

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.hint = hint
