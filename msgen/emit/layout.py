"""Lay out rendered Python as black, pinned in pyproject.toml, would, without
importing it: black's import and a pass over model.py and train.py cost more CPU
than all the rest of `msgen compile` together.

The templates are written black-clean (tests/test_layout.py runs the pinned black
over every tree and wants no change), so only the lines that carry generated
values can be too long. Those are statements that end in one bracketed list:
`self.att = Attention(heads=32, ...)`, `NO_WEIGHT_DECAY = [...]`,
`for first, end, stage in (...):`, or a dict entry `"name": (...),`. For them this
module makes black's right-hand split: the bracket's contents on one line of their
own if they fit, else one item a line with a trailing comma. Any other long line
is beyond it, and the whole text goes to black instead (`format_python`).
"""

from __future__ import annotations

import re

LINE_LENGTH = 88  # black's default, which the generated code keeps
INDENT = "    "
CLOSING = {")": "(", "]": "[", "}": "{"}
TAILS = ("", ":", ",")
# The statements split here, up to their last bracket: `name(`, `target = name(`,
# `target = [`, `for a, b in (`, `"key": (`, a keyword argument `key={` (an item of a
# call split above it). A name is a dotted one, a target has no
# brackets; anything else in front of the bracket (an operator, a keyword, a call)
# brings in black's other rules.
HEADS = re.compile(
    r"""(?:[\w.]+(?:, [\w.]+)* = |\w+=)?[\w.]*[(\[{]|for [\w, ]+ in [(\[]|"[^"\\]*": [(\[{]"""
)


class _Beyond(Exception):
    """A line this module does not know how black splits."""


def _outside_strings(code: str):
    """(position, character) of each character of `code` outside its string literals.
    Raises _Beyond on what black alone reads right: escapes, prefixed strings, comments."""
    i = 0
    while i < len(code):
        ch = code[i]
        if ch in "'\"":
            end = code.find(ch, i + 1)
            if end < 0 or "\\" in code[i:end] or code[i - 1 : i].isalpha():
                raise _Beyond(code)
            i = end
        elif ch == "#":
            raise _Beyond(code)
        else:
            yield i, ch
        i += 1


def _brackets(code: str) -> list[tuple[int, int]]:
    """(position of an opening bracket, of its closing one) at the top level of `code`."""
    pairs: list[tuple[int, int]] = []
    stack: list[int] = []
    for i, ch in _outside_strings(code):
        if ch in "([{":
            stack.append(i)
        elif ch in CLOSING:
            if not stack or code[stack[-1]] != CLOSING[ch]:
                raise _Beyond(code)
            opened = stack.pop()
            if not stack:
                pairs.append((opened, i))
    if stack:
        raise _Beyond(code)
    return pairs


def _items(body: str) -> list[str]:
    """The comma-separated items of a bracket's contents."""
    cuts = [-1]
    depth = 0
    for i, ch in _outside_strings(body):
        if ch in "([{":
            depth += 1
        elif ch in CLOSING:
            depth -= 1
        elif ch == "," and depth == 0:
            cuts.append(i)
    items = [body[a + 1 : b].strip() for a, b in zip(cuts, cuts[1:] + [len(body)])]
    return items if items[-1] else items[:-1]


def _fits(line: str) -> bool:
    return len(line) <= LINE_LENGTH


def _split(indent: str, code: str) -> list[str]:
    """Black's right-hand split of one statement too long for its line."""
    pairs = _brackets(code)
    if not pairs:
        raise _Beyond(code)
    opened, closed = pairs[-1]
    head, body, tail = code[: opened + 1], code[opened + 1 : closed], code[closed:]
    if tail[1:] not in TAILS or not HEADS.fullmatch(head):
        raise _Beyond(code)  # black splits other statements by other rules
    inner = indent + INDENT
    items = _items(body)
    if not _fits(indent + head) or not items:
        raise _Beyond(code)
    # A bracket that opens a literal (a tuple, list or dict, not a call's or a
    # subscript's) with commas inside always gets an item a line (black's
    # linegen.should_split_line); a trailing comma left by the author does too.
    before = head[-2:-1]  # HEADS leaves a name's last character or a space there
    literal = not (before.isalnum() or before == "_")
    trailing = body.rstrip().endswith(",")
    if literal:
        explode = len(items) > 1 or (trailing and head[-1] != "(")
    else:
        explode = trailing
    if _fits(inner + body.strip()) and not explode:
        return [indent + head, inner + body.strip(), indent + tail]
    if len(items) == 1:
        raise _Beyond(code)
    lines = [indent + head]
    for item in items:
        line = inner + item + ","
        lines.extend([line] if _fits(line) else _split(inner, item + ","))
    return [*lines, indent + tail]


def _string_alone(code: str) -> bool:
    """A string alone on its line, perhaps an item (`f"...",`): black cannot split it."""
    code = code.removesuffix(",").lstrip("fFrRbB")
    return len(code) > 1 and code[0] in "'\"" and code[-1] == code[0]


def lay_out(source: str) -> str | None:
    """`source` with its long lines split as black splits them, or None when a
    long line is of a kind this module does not split."""
    out: list[str] = []
    in_string = False  # inside a triple-quoted string, which black leaves as it is
    for line in source.split("\n"):
        code = line.lstrip(" ")
        quoted = in_string or '"""' in code
        in_string ^= code.count('"""') % 2 == 1
        if _fits(line) or quoted or code.startswith("#") or _string_alone(code):
            out.append(line)
            continue
        try:
            out.extend(_split(line[: len(line) - len(code)], code))
        except _Beyond:
            return None
    return "\n".join(out)


def format_python(source: str) -> str:
    """Rendered Python in black's layout: this module's when it can, black's own
    (imported only then) when it cannot."""
    laid_out = lay_out(source)
    if laid_out is not None:
        return laid_out
    import black

    return black.format_str(source, mode=black.Mode(target_versions={black.TargetVersion.PY311}))
