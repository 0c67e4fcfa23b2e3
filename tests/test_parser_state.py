"""The parser keeps what fmt needs beside the tree (comments, and every token with
its position) per parse, from the one lexer: parses on several threads at once
each get their own."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from msgen.syntax import parse

SPEC = (Path(__file__).resolve().parents[1] / "specs" / "tiny.msl").read_text()


def marked(i: int) -> str:
    return f"# spec {i}\n" + SPEC.replace("mesh {", f"mesh {{  # mesh of spec {i}", 1)


def test_each_parse_keeps_its_own_comments_across_threads():
    texts = [marked(i) for i in range(16)]
    with ThreadPoolExecutor(8) as pool:
        modules = list(pool.map(lambda t: parse(t)[0], texts * 4))
    for i, module in enumerate(modules):
        n = i % 16
        assert module.comments[0] == (1, f"# spec {n}")
        assert f"# mesh of spec {n}" in [text for _, text in module.comments]
        assert module.tokens == modules[n].tokens


def test_tokens_are_the_lexers_with_positions():
    module, _ = parse("model m {\n    x = f(a, [1, 2])  # note\n}\n")
    assert [t for _, _, t in module.tokens] == [
        "model", "m", "{", "x", "=", "f", "(", "a", ",", "[", "1", ",", "2", "]", ")", "}",
    ]  # fmt: skip
    assert (2, 10, "(") in module.tokens and (2, 14, "[") in module.tokens
    assert module.comments == ((2, "# note"),)
