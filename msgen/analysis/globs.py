"""Which copies of a repeated layer a fusion glob takes, as runs of copy indices,
found without visiting every copy: a 2^40-layer spec costs what a 32-layer one does.

A parameter path of copy i is `before + str(i) + after` (`decoder.` i `.qkv.weight`).
The copies with d digits whose index starts with the digits p form one interval;
if a glob matches every index of it or none, the interval is one run, otherwise it
is split by the next digit. Whether a glob matches every or no completion of p is
read off its automaton run over the unknown digits (fnmatch's `*`, `?`, `[...]`,
case-sensitive as fnmatchcase). A glob that picks copies by their digits
(`decoder.1*.qkv.weight`) yields a run per interval it picks, and no more.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from functools import lru_cache

DIGITS = "0123456789"
STAR = None  # the token of `*`; any other token is a one-character test


def _tokens(glob: str) -> tuple:
    """`glob` as tokens: STAR, or a compiled one-character pattern (`?`, a literal,
    a bracket set), each exactly as fnmatch reads it."""
    out: list = []
    i = 0
    while i < len(glob):
        c = glob[i]
        if c == "*":
            if not out or out[-1] is not STAR:
                out.append(STAR)
            i += 1
            continue
        j = i + 1
        if c == "[":  # fnmatch's rule for where a set ends; unclosed: a literal `[`
            j = i + 1
            if j < len(glob) and glob[j] == "!":
                j += 1
            if j < len(glob) and glob[j] == "]":
                j += 1
            while j < len(glob) and glob[j] != "]":
                j += 1
            j = j + 1 if j < len(glob) else i + 1
        out.append(re.compile(fnmatch.translate(glob[i:j])))
        i = j
    return tuple(out)


class _Glob:
    def __init__(self, glob: str):
        self.tokens = _tokens(glob)
        self.end = len(self.tokens)
        self.steps: dict[tuple[frozenset[int], str], frozenset[int]] = {}
        self.prefixes: dict[str, frozenset[int]] = {}
        self.digit_runs: dict[tuple[frozenset[int], int], frozenset[frozenset[int]]] = {}
        self.endings: dict[tuple[frozenset[int], str], bool] = {}

    def closure(self, states) -> frozenset[int]:
        out = set(states)
        for p in sorted(out):
            while p < self.end and self.tokens[p] is STAR:
                p += 1
                out.add(p)
        return frozenset(out)

    def step(self, states: frozenset[int], c: str) -> frozenset[int]:
        key = (states, c)
        if key not in self.steps:
            self.steps[key] = self._step(states, c)
        return self.steps[key]

    def _step(self, states: frozenset[int], c: str) -> frozenset[int]:
        nxt = set()
        for p in states:
            if p == self.end:
                continue
            tok = self.tokens[p]
            if tok is STAR:
                nxt.add(p)
            elif tok.match(c):
                nxt.add(p + 1)
        return self.closure(nxt)

    def verdict(self, before: str, unknown: int, after: str) -> bool | None:
        """True if the glob matches `before + any `unknown` digits + after`, False if
        it matches none of them, None if it depends on the digits."""
        matched = {
            self._accepts(s, after) for s in self._after_digits(self._after(before), unknown)
        }
        return matched.pop() if len(matched) == 1 else None

    # The three parts, each remembered: glob_runs asks about `before` one digit longer
    # at a time, and about the same unknown digits and `after` many times.

    def _after(self, text: str) -> frozenset[int]:
        if text not in self.prefixes:
            start = len(text)
            while start and text[:start] not in self.prefixes:
                start -= 1
            states = self.prefixes[text[:start]] if start else self.closure({0})
            for i in range(start, len(text)):
                states = self.step(states, text[i])
                self.prefixes[text[: i + 1]] = states
            self.prefixes[text] = states
        return self.prefixes[text]

    def _after_digits(self, states: frozenset[int], unknown: int) -> frozenset[frozenset[int]]:
        key = (states, unknown)
        if key not in self.digit_runs:
            if unknown == 0:
                found = frozenset({states})
            else:
                found = frozenset().union(
                    *(self._after_digits(self.step(states, d), unknown - 1) for d in DIGITS)
                )
            self.digit_runs[key] = found
        return self.digit_runs[key]

    def _accepts(self, states: frozenset[int], after: str) -> bool:
        key = (states, after)
        if key not in self.endings:
            for c in after:
                states = self.step(states, c)
            self.endings[key] = self.end in states
        return self.endings[key]


@lru_cache(maxsize=256)
def _glob(glob: str) -> _Glob:
    return _Glob(glob)


def _group_of(groups, before: str, unknown: int, after: str) -> int | None | bool:
    """The index of the first group with a glob matching every completion; None
    when no group matches any; False when it depends on the unknown digits."""
    for g, globs in enumerate(groups):
        verdicts = [_glob(glob).verdict(before, unknown, after) for glob in globs]
        if True in verdicts:
            return g
        if None in verdicts:
            return False
    return None


def glob_runs(
    groups: Sequence[Sequence[str]], before: str, after: str, count: int
) -> list[tuple[int, int, int | None]]:
    """(first, end, group) runs covering copies 0 .. count - 1, in order: `group` is
    the index of the first of `groups` (each a list of globs) that matches the path
    `before + str(i) + after` of every copy i in the run, None where none does.
    Adjacent runs of one group are merged."""
    out: list[tuple[int, int, int | None]] = []

    def visit(prefix: str, unknown: int) -> None:
        lo = int(prefix) * 10**unknown
        if lo >= count:
            return
        hi = min((int(prefix) + 1) * 10**unknown, count)
        group = _group_of(groups, before + prefix, unknown, after)
        if group is False:
            for d in DIGITS:
                visit(prefix + d, unknown - 1)
            return
        if out and out[-1][1] == lo and out[-1][2] == group:
            out[-1] = (out[-1][0], hi, group)
        else:
            out.append((lo, hi, group))

    for digits in range(1, len(str(max(count - 1, 0))) + 1):
        for first in DIGITS if digits == 1 else DIGITS[1:]:
            visit(first, digits - 1)
    return out


def matches_some(glob: str, before: str, after: str, count: int) -> bool:
    """Whether `glob` matches the path `before + str(i) + after` of some copy
    i < count: exactly the copies glob_runs gives the glob's fusion id."""
    return any(group == 0 for _, _, group in glob_runs([[glob]], before, after, count))
