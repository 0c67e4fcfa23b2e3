"""Mutations of the files msgen's tools read from outside (tests/file_mutations.py
runs them): a JSON document edited in its tree (a value swapped for one of another
type, a number no count can be, NaN and Infinity, nesting deeper than any reader
takes, a key deleted, repeated or renamed, a name with `../` or a terminal escape) or
in its text; a safetensors file's header (offsets overlapping, out of range, out of
order; shapes, dtypes and the length prefix) and bytes; a CSV log's cells, rows,
columns and text (NUL bytes, a field past csv's limit, a quote left open). Each
mutator returns the new bytes and what it did, in words (the reproducer's label).
"""

from __future__ import annotations

import copy
import csv
import io
import json
import random
import struct


class Raw(str):
    """JSON text put in as it is."""


class Dup:
    """An object's key written twice: first `first`, then `second`."""

    def __init__(self, first, second):
        self.first, self.second = first, second


# JSON text no json.dumps writes: numbers past what a count can be, tokens that are
# not JSON, nesting at and past the readers' 64 levels and far past Python's limit.
NUMBERS = [Raw("9" * 400), Raw("1" + "0" * 40), 10**8, 2**31, 2**40, 2**63, 2**64 + 1,
           -(2**63) - 1, 10**18, 1e308, -1e308, 1.7976931348623157e308, 5e-324, 0, -1, 0.5,
           -0.0, Raw("1e999"), Raw("-1E400"), Raw("NaN"), Raw("Infinity"), Raw("-Infinity"),
           Raw("nan"), Raw("0x10"), Raw("01"), Raw("+1"), Raw(".5")]  # fmt: skip
TYPES = ["8", "", "x", 0, 1, 2, 1.5, True, False, None, [], {}, [1, 2], {"a": 1}, [[]],
         ["a"], {"": None}]  # fmt: skip
DEEP = [Raw("[" * n + "]" * n) for n in (63, 64, 65, 100_000)] + [
    Raw('{"a": ' * 70 + "1" + "}" * 70),
    Raw("[" * 100_000),  # never closed
]
STRINGS = ["../../../../etc/passwd", "/etc/passwd", "..", ".", "a/../../b", "/dev/zero",
           "\x1b[2J\x1b[31mred", "a\nb", "a\rb", "\u202eevil", "é", "\ud800", "\x00", " ",
           "x" * 100_000, "rank_0", "model.safetensors", "model-00001-of-00002.safetensors",
           "F32", "BF16", "F16", "I64", "F8_E4M3", "default", "llama3", "float32", "bfloat16",
           "silu", "sliding_attention", "msgen-calibration 1", "ascend910b", "a100_80g",
           "matmul_efficiency", "intra.efficiency", "NaN", "tiny2.msl", "../tiny.msl"]  # fmt: skip


def dumps(node) -> str:
    if isinstance(node, Raw):
        return str(node)
    if isinstance(node, dict):
        items = []
        for key, value in node.items():
            if isinstance(value, Dup):
                items.append(f"{json.dumps(key)}: {dumps(value.first)}")
                value = value.second
            items.append(f"{json.dumps(key)}: {dumps(value)}")
        return "{" + ", ".join(items) + "}"
    if isinstance(node, list):
        return "[" + ", ".join(dumps(v) for v in node) + "]"
    return json.dumps(node)  # a float NaN or infinity is written NaN, Infinity


def _slots(node, path="", out=None) -> list[tuple[object, object, str]]:
    """(container, key, path) of every value in the tree."""
    out = [] if out is None else out
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for key, value in list(items):
        where = f"{path}.{key}" if isinstance(node, dict) else f"{path}[{key}]"
        out.append((node, key, where))
        if isinstance(value, (dict, list)) and len(out) < 100_000:
            _slots(value, where, out)
    return out


def _strings(doc) -> list[str]:
    if isinstance(doc, dict):
        return [s for k, v in doc.items() for s in (k, *_strings(v))]
    if isinstance(doc, list):
        return [s for v in doc for s in _strings(v)]
    return [doc] if isinstance(doc, str) else []


def _near(value, doc, rnd: random.Random):
    """A value of the same kind: what a plausible mistake or a lie would put there."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return rnd.choice([value + 1, value - 1, value * 2, -value, 0, value * 10**12])
    if isinstance(value, float):
        return rnd.choice([value * 1e300, -value, value / 1e300, 0.0, value + 1])
    if isinstance(value, str):
        return rnd.choice(_strings(doc) or STRINGS)
    if isinstance(value, list):
        return rnd.choice([value[:-1], value + value[-1:], [], value[::-1]])
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if rnd.random() < 0.7}
    return rnd.choice(TYPES)


def _short(value) -> str:
    text = dumps(value) if not isinstance(value, Dup) else "a repeated key"
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} chars)"


def edit_tree(doc, rnd: random.Random) -> tuple[object, str]:
    """One edit of the tree `doc` (in place where it can be); (doc, what was done)."""
    slots = _slots(doc) if isinstance(doc, (dict, list)) else []
    kind = rnd.choices(("type", "number", "near", "string", "deep", "delete", "dup",
                        "rename", "swap"), (3, 3, 4, 2, 1, 2, 1, 1, 1))[0]  # fmt: skip
    if not slots:
        return rnd.choice(TYPES + NUMBERS), "the document replaced"
    parent, key, path = rnd.choice(slots)
    new = {
        "type": lambda: copy.deepcopy(rnd.choice(TYPES)),
        "number": lambda: rnd.choice(NUMBERS),
        "near": lambda: _near(parent[key], doc, rnd),
        "string": lambda: rnd.choice(STRINGS),
        "deep": lambda: rnd.choice(DEEP),
    }
    if kind in new:
        parent[key] = new[kind]()
        return doc, f"{path} = {_short(parent[key])}"
    if kind == "delete":
        del parent[key]
        return doc, f"{path} deleted"
    if kind == "dup" and isinstance(parent, dict):
        parent[key] = Dup(parent[key], rnd.choice([*TYPES, *NUMBERS, *STRINGS]))
        return doc, f"{path} repeated as {_short(parent[key].second)}"
    if kind == "rename" and isinstance(parent, dict):
        name = rnd.choice(STRINGS + [k for k in parent if k != key])
        parent[name] = parent.pop(key)
        return doc, f"{path} renamed {_short(name)}"
    other, okey, opath = rnd.choice(slots)
    try:
        parent[key], other[okey] = other[okey], parent[key]
    except (KeyError, IndexError):  # one slot inside the other, already moved
        return doc, f"{path} and {opath} swapped (one inside the other)"
    return doc, f"{path} and {opath} swapped"


def mutate_json(data: bytes, rnd: random.Random) -> tuple[bytes, str]:
    """One to three edits of the document's tree; or, now and then, of its bytes."""
    try:
        doc = json.loads(data)
    except ValueError:
        return mutate_bytes(data, rnd)
    if rnd.random() < 0.15:
        return mutate_bytes(data, rnd)
    edits = []
    for _ in range(rnd.choices((1, 2, 3), (6, 3, 1))[0]):
        doc, edit = edit_tree(doc, rnd)
        edits.append(edit)
    return dumps(doc).encode("utf-8", "surrogatepass"), "; ".join(edits)


def mutate_bytes(data: bytes, rnd: random.Random) -> tuple[bytes, str]:
    """Bytes cut, flipped or inserted: a file written half, or damaged on disk."""
    kind = rnd.choice(("truncate", "flip", "insert", "empty", "bom"))
    at = rnd.randrange(len(data) + 1)
    if kind == "truncate":
        return data[:at], f"cut at byte {at} of {len(data)}"
    if kind == "flip" and data:
        spots = sorted(rnd.randrange(len(data)) for _ in range(rnd.randint(1, 4)))
        out = bytearray(data)
        for i in spots:
            out[i] ^= 1 << rnd.randrange(8)
        return bytes(out), f"bits flipped at bytes {spots}"
    if kind == "insert":
        junk = rnd.choice([b"\x00", b"\xff\xfe", b"\x1b[2J", b"\r", b'"', b"{", b"]", b"\n" * 3])
        return data[:at] + junk + data[at:], f"{junk!r} inserted at byte {at}"
    if kind == "bom":
        return b"\xef\xbb\xbf" + data, "a UTF-8 byte order mark put first"
    return b"", "emptied"


# safetensors ---------------------------------------------------------------------


def mutate_safetensors(data: bytes, rnd: random.Random) -> tuple[bytes, str]:
    """The header's offsets, shapes, dtypes or tree, its length prefix, or the bytes."""
    (size,) = struct.unpack("<Q", data[:8])
    header, body = json.loads(data[8 : 8 + size]), data[8 + size :]
    roll = rnd.random()
    if roll < 0.15:
        return mutate_bytes(data, rnd)
    if roll < 0.3:
        head = data[8 : 8 + size]
        prefix = rnd.choice([0, 1, 7, size - 1, size + 1, len(data), 100 << 20, (100 << 20) + 1,
                             2**63, 2**64 - 1])  # fmt: skip
        return struct.pack("<Q", prefix) + head + body, f"header length {prefix} (is {size})"
    if roll < 0.65:
        header, edit = _edit_entry(header, len(body), rnd)
    else:
        header, edit = edit_tree(header, rnd)
    head = dumps(header).encode("utf-8", "surrogatepass")
    head += b" " * (-len(head) % 8)
    return struct.pack("<Q", len(head)) + head + body, edit


def _edit_entry(header: dict, data_size: int, rnd: random.Random) -> tuple[dict, str]:
    names = [n for n in header if n != "__metadata__"]
    name, other = rnd.choice(names), rnd.choice(names)
    entry = header[name]
    begin, end = entry["data_offsets"]
    kind = rnd.choice(("overlap", "range", "order", "shape", "dtype", "name", "dup"))
    if kind == "overlap":
        entry["data_offsets"] = rnd.choice(
            [
                list(header[other]["data_offsets"]),
                [begin + 4, end + 4],
                [max(0, begin - 4), end - 4],
            ]
        )
    elif kind == "range":
        entry["data_offsets"] = rnd.choice(
            [[begin, data_size + 4], [data_size, data_size + end - begin], [-4, end - begin - 4],
             [end, begin], [begin, begin], [begin, 2**64], [Raw("9" * 400), end]]
        )  # fmt: skip
    elif kind == "order":  # two tensors' places exchanged: out of order, maybe not of size
        entry["data_offsets"], header[other]["data_offsets"] = (
            header[other]["data_offsets"],
            entry["data_offsets"],
        )
    elif kind == "shape":
        entry["shape"] = rnd.choice(
            [[2**40, 2**40], [-1, 4], [0], [], [2**62, 4], [2**32, 2**32, 4], ["8"], [1.5],
             list(reversed(entry["shape"])), entry["shape"] + [1], [(end - begin) // 4]]
        )  # fmt: skip
    elif kind == "dtype":
        entry["dtype"] = rnd.choice(["F16", "BF16", "F64", "I8", "U8", "BOOL", "F8_E4M3", "", 4])
    elif kind == "name":
        header[rnd.choice(STRINGS[:13]) + name] = header.pop(name)
    else:
        header[name] = Dup(header[other], entry)
    return header, f"{name}: {kind} ({_short(header.get(name, '-'))})"


# CSV ---------------------------------------------------------------------------------

CELLS = ["nan", "inf", "-inf", "NaN", "1e308", "-1e308", "1.7976931348623157e308", "1e999",
         "9" * 400, "", "x", "-1", "0", "1e-320", "-0", "0x10", " 3", "1_0", "1e17"]  # fmt: skip
STEPS = ["0", "-1", "9" * 400, "1e3", "1.5", "99999999999999999999", "", "x", "1"]
# series whose spread is below float resolution, or at the ends of the floats
FLAT = [("1e17", "1.0000000000000002e17"), ("1.7e308", "-1.7e308"),
        ("1.7976931348623157e308", "1.7976931348623155e308"), ("5e-324", "0"), ("1", "1")]  # fmt: skip


def mutate_csv(data: bytes, rnd: random.Random) -> tuple[bytes, str]:
    """A log's cells, steps, rows and columns; or its text (NUL, an open quote, a field
    past csv's 131,072-character limit, a lone CR, bytes that are not UTF-8)."""
    if rnd.random() < 0.25:
        return _mutate_log_text(data, rnd)
    rows = list(csv.reader(io.StringIO(data.decode("utf-8", "replace"))))
    if len(rows) < 3:
        return mutate_bytes(data, rnd)
    width = len(rows[0])
    at, col = rnd.randrange(1, len(rows)), rnd.randrange(width)
    kind = rnd.choice(("cell", "step", "flat", "row", "header", "width"))
    if kind == "cell":
        rows[at][col] = rnd.choice(CELLS)
        edit = f"line {at + 1} {rows[0][col]} = {rows[at][col][:20]!r}"
    elif kind == "step":
        rows[at][0] = rnd.choice(STEPS)
        edit = f"line {at + 1} step = {rows[at][0][:20]!r}"
    elif kind == "flat":
        pair = rnd.choice(FLAT)
        for i, row in enumerate(rows[1:]):
            row[col] = pair[i % 2]
        edit = f"{rows[0][col]} alternates {pair}"
    elif kind == "row":
        how = rnd.choice(("delete", "duplicate", "swap", "reverse"))
        if how == "delete":
            del rows[at]
        elif how == "duplicate":
            rows.insert(at, list(rows[at]))
        elif how == "swap":
            other = rnd.randrange(1, len(rows))
            rows[at], rows[other] = rows[other], rows[at]
        else:
            rows[1:] = rows[:0:-1]
        edit = f"rows: {how} at line {at + 1}"
    elif kind == "header":
        rows[0][col] = rnd.choice(["", "step", "loss", "\x1b[2Jx", "a\nb", "é", rows[0][col] * 2])
        edit = f"column {col} named {rows[0][col]!r}"
    else:
        if rnd.random() < 0.5:
            del rows[at][col:]
        else:
            rows[at] += ["1"] * rnd.randint(1, 3)
        edit = f"line {at + 1} has {len(rows[at])} fields"
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue().encode("utf-8", "surrogatepass"), edit


def _mutate_log_text(data: bytes, rnd: random.Random) -> tuple[bytes, str]:
    lines = data.split(b"\n")
    at = rnd.randrange(1, max(2, len(lines) - 1))
    kind = rnd.choice(("nul", "quote", "huge", "cr", "latin1", "bytes"))
    if kind == "bytes":
        return mutate_bytes(data, rnd)
    lines[at] = {
        "nul": lines[at].replace(b",", b",\x00", 1),
        "quote": b'"' + lines[at],
        "huge": lines[at] + b"," + b"9" * 200_000,
        "cr": lines[at].replace(b",", b"\r", 1),
        "latin1": lines[at] + b",\xe9\xff",
    }[kind]
    return b"\n".join(lines), f"line {at + 1}: {kind}"
