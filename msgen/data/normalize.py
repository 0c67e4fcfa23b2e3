"""Unicode normalisation of each document, counting what it changed.

NFKC (the default) folds compatibility characters: full-width Latin and punctuation,
ligatures, circled digits, half-width katakana. Without it the same word reaches
the tokenizer in several spellings, and the rarer ones split into many tokens.
"""

from __future__ import annotations

import unicodedata

FORMS = {"nfkc": "NFKC", "nfc": "NFC", "none": None}


def normalize(text: str, form: str | None) -> tuple[str, int]:
    """The normalised text and how many characters changed: the code points the form
    rewrites on their own (`Ａ` -> `A`, `ﬁ` -> `fi`), or, where only composition
    changed something (`e` + U+0301 -> `é`), the code points it merged."""
    if form is None or unicodedata.is_normalized(form, text):
        return text, 0
    out = unicodedata.normalize(form, text)
    # Per distinct character, so the Python-level work follows the alphabet, not the text.
    changed = sum(text.count(c) for c in set(text) if unicodedata.normalize(form, c) != c)
    return out, changed or max(len(text) - len(out), 1)
