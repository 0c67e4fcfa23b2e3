"""The Hugging Face tokenizer: load one, or train a byte-level BPE of the spec's vocab;
find its EOS token; say how many ids it can produce."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from msgen.data import DataError

# EOS spellings of common tokenizers, tried in this order when neither --eos nor a
# tokenizer_config.json beside the tokenizer names one.
EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>", "[EOS]")
TRAINED_EOS = "<|endoftext|>"  # GPT-2's, the usual one for a byte-level BPE
BYTE_ALPHABET = 256  # a byte-level BPE starts from every byte


def load(path: Path):
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for a bad file
        raise DataError(
            f"cannot load tokenizer {path}: {exc}",
            "--tokenizer takes a Hugging Face tokenizer.json",
        ) from None


def id_count(tokenizer) -> int:
    """One more than the largest id the tokenizer can produce: what must fit in vocab."""
    return max(tokenizer.get_vocab(with_added_tokens=True).values()) + 1


def configured_eos(path: Path) -> str | None:
    """The EOS that a tokenizer_config.json beside the tokenizer names, if any."""
    try:
        config = json.loads((path.parent / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
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
