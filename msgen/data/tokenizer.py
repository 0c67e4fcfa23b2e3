"""The Hugging Face tokenizer: load one, or train a byte-level BPE of the spec's vocab;
find its EOS token; say how many ids it can produce; encode text as plain text.

msgen trusts what a tokenizer.json says (its regexes, its normalizers): it runs them.
What it does not trust is that they work, so every call into the library that can
fail on a bad file (an error, or a Rust panic, which Python sees as a BaseException)
is a DataError naming the tokenizer.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from contextlib import contextmanager
from pathlib import Path

from msgen.base.files import read_regular
from msgen.data import DataError
from msgen.data.sources import shown

# EOS spellings of common tokenizers, tried in this order when neither --eos nor a
# tokenizer_config.json beside the tokenizer names one.
EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>", "[EOS]")
TRAINED_EOS = "<|endoftext|>"  # GPT-2's, the usual one for a byte-level BPE
BYTE_ALPHABET = 256  # a byte-level BPE starts from every byte
TOKENIZER_LIMIT = 1 << 30  # bytes of a tokenizer.json (the largest in use are ~30 MB)
CONFIG_LIMIT = 16 << 20  # bytes of a tokenizer_config.json
# Encoded once when a tokenizer is loaded: letters, digits, punctuation, accents, CJK,
# an emoji and the text of a special token, so a tokenizer that cannot encode text
# fails before the corpus is read.
PROBE = "Hello, World! 1234 café ÄÖÜ 你好，世界 😀 <|endoftext|>\n\tx"


def is_panic(exc: BaseException) -> bool:
    """A panic in the tokenizers library's Rust code (pyo3's PanicException)."""
    return type(exc).__name__ == "PanicException"


@contextmanager
def tokenizer_calls(what: str):
    """Errors and panics of the tokenizers library inside the block become one line:
    `what` failed, and why."""
    try:
        yield
    except BaseException as exc:
        if not (isinstance(exc, Exception) or is_panic(exc)) or isinstance(exc, DataError):
            raise
        lines = str(exc).strip().splitlines()
        raise DataError(
            f"{what}: {lines[0] if lines else type(exc).__name__}",
            "msgen data takes a Hugging Face tokenizer.json that works",
        ) from None


@contextmanager
def panic_reports_held():
    """Rust prints a panic's own report (and backtrace) to file descriptor 2 itself;
    while a tokenizer file is first tried, that goes to a temporary file instead,
    and the DataError's one line is all the user sees."""
    saved = os.dup(2)
    try:
        with tempfile.TemporaryFile() as held:
            os.dup2(held.fileno(), 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
    finally:
        os.close(saved)


def load(path: Path):
    """The tokenizer in `path` and the bytes it was read from (for its hash), checked
    to encode text; special tokens in documents are encoded as plain text."""
    from tokenizers import Tokenizer

    try:
        data = read_regular(path, TOKENIZER_LIMIT)
    except OSError as exc:
        raise DataError(f"cannot read tokenizer {shown(path)}: {exc.strerror or exc}") from None
    with panic_reports_held():
        with tokenizer_calls(f"cannot load tokenizer {shown(path)}"):
            tokenizer = Tokenizer.from_str(data.decode("utf-8"))
        plain_text(tokenizer, f"tokenizer {shown(path)}")
        with tokenizer_calls(f"tokenizer {shown(path)} cannot encode text"):
            tokenizer.encode_batch_fast([PROBE], add_special_tokens=False)
            empty = not tokenizer.get_vocab(with_added_tokens=True)
    if empty:
        raise DataError(f"tokenizer {shown(path)} has an empty vocabulary")
    return tokenizer, data


def plain_text(tokenizer, name: str) -> None:
    """Special-token text inside a document (`<|endoftext|>` written in a web page) is
    encoded as the text it is, never as the special token: only msgen puts EOS ids
    between documents (tiktoken's `disallowed_special` guards the same)."""
    with tokenizer_calls(f"{name} cannot encode special tokens as text"):
        tokenizer.encode_special_tokens = True


def special_texts(tokenizer) -> tuple[str, ...]:
    """The texts of the tokenizer's special tokens, whose occurrences in documents are
    counted (they are encoded as plain text)."""
    with tokenizer_calls("cannot list the tokenizer's special tokens"):
        added = tokenizer.get_added_tokens_decoder().values()
    return tuple(sorted({t.content for t in added if t.special and t.content}))


class SpecialCounter:
    """Counts special-token texts in documents. Most documents hold none: a search for
    the tokens' first two characters rules them out before any full count."""

    def __init__(self, texts: tuple[str, ...]):
        self.texts = texts
        self.prefixes = tuple(sorted({t[:2] for t in texts}))
        self.found = 0

    def count(self, text: str) -> None:
        if any(p in text for p in self.prefixes):
            self.found += sum(text.count(t) for t in self.texts)


def id_count(tokenizer) -> int:
    """One more than the largest id the tokenizer (with a vocabulary, as `load` checks)
    can produce: what must fit in vocab."""
    with tokenizer_calls("cannot read the tokenizer's vocabulary"):
        return max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1


def configured_eos(path: Path) -> str | None:
    """The EOS that a tokenizer_config.json beside the tokenizer names, if any."""
    config_path = path.parent / "tokenizer_config.json"
    if not os.path.lexists(config_path):
        return None
    try:
        config = json.loads(read_regular(config_path, CONFIG_LIMIT))
    except OSError as exc:
        raise DataError(f"cannot read {shown(config_path)}: {exc.strerror or exc}") from None
    except (ValueError, RecursionError):
        raise DataError(
            f"{shown(config_path)} is not JSON",
            "fix it, or move it away and name the EOS with --eos",
        ) from None
    eos = config.get("eos_token") if isinstance(config, dict) else None
    if isinstance(eos, dict):
        eos = eos.get("content")
    return eos if isinstance(eos, str) else None


def find_eos(tokenizer, path: Path | None, eos: str | None) -> tuple[str, int]:
    """The EOS token and its id: --eos, else tokenizer_config.json, else a known name."""
    if eos is not None:
        eos_id = tokenizer.token_to_id(eos)
        if eos_id is None:
            raise DataError(f"--eos {eos} is not a token of the tokenizer")
        return eos, eos_id
    candidates = ([configured_eos(path)] if path else []) + list(EOS_NAMES)
    for name in candidates:
        if name is not None and tokenizer.token_to_id(name) is not None:
            return name, tokenizer.token_to_id(name)
    raise DataError(
        "the tokenizer has no EOS token msgen knows",
        f"name the token that ends a document with --eos (looked for: {', '.join(EOS_NAMES)})",
    )


def encode(tokenizer, texts: list[str], where) -> list[list[int]]:
    """The ids of each text, without the special tokens a post-processor would add."""
    with tokenizer_calls(f"the tokenizer failed on the documents from {where}"):
        return [e.ids for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]


def train(texts: Iterable[str], vocab: int):
    """A byte-level BPE of at most `vocab` ids (EOS among them) learned from `texts`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=[TRAINED_EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer
