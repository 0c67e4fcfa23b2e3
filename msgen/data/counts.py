"""What a unit's work counted, summed over the units for the summary and dataset.json."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

from msgen.data.readers import Skipped

MAX_WARNINGS = 10  # skipped documents shown one by one; the rest are counted


@dataclass
class Counts:
    documents: int = 0  # documents read with text
    duplicates: int = 0
    normalized_documents: int = 0
    normalized_characters: int = 0
    cut_documents: int = 0  # pieces of texts longer than MAX_DOCUMENT
    special_token_texts: int = 0
    skipped: Counter = field(default_factory=Counter)  # by reason
    keys: tuple[str, ...] | None = None  # of the first record without the field
    shown: list[Skipped] = field(default_factory=list)  # the first skipped, to show

    def skip(self, item: Skipped, warn: bool = True) -> None:
        self.skipped[item.reason] += 1
        if self.keys is None and item.keys:
            self.keys = item.keys
        if warn and len(self.shown) < MAX_WARNINGS:
            self.shown.append(item)

    def add(self, other: Counts) -> None:
        """Another unit's counts, in dataset order (the first keys and warnings stay)."""
        for name in (
            "documents",
            "duplicates",
            "normalized_documents",
            "normalized_characters",
            "cut_documents",
            "special_token_texts",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.skipped.update(other.skipped)
        self.keys = self.keys or other.keys
        self.shown += other.shown[: MAX_WARNINGS - len(self.shown)]

    def record(self) -> dict:
        """As a unit's record keeps it (the warnings shown are not kept)."""
        out = asdict(self)
        out["skipped"] = dict(self.skipped)
        del out["shown"]
        return out

    @classmethod
    def from_record(cls, record: dict) -> Counts:
        keys = record.get("keys")
        return cls(
            **{**record, "skipped": Counter(record["skipped"]), "keys": keys and tuple(keys)}
        )


@dataclass
class SetCounts:
    """One set (train or valid) of one unit, or of the whole dataset."""

    name: str
    length: int  # tokens per window: seq + 1
    documents: int = 0
    tokens: int = 0  # EOS included
    windows: int = 0
    dropped: int = 0  # tokens after the last window, which no window holds

    def add(self, other: SetCounts) -> None:
        self.documents += other.documents
        self.tokens += other.tokens
        self.windows += other.windows
        self.dropped += other.dropped
