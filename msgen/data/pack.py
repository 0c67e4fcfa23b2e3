"""Packing: the token stream (each document followed by EOS) cut into fixed windows.

A window is `seq + 1` tokens (train.py feeds `[:-1]` and predicts `[1:]`); each starts
`seq + 1 - overlap` tokens after the one before. The stream is held only until it
fills a window, so memory follows the window and the batch, not the corpus.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Packer:
    length: int  # tokens per window: seq + 1
    overlap: int = 0  # tokens a window repeats from the one before
    tokens: int = 0  # tokens that entered the stream, EOS included
    windows: int = 0
    pending: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))

    def add(self, stream: list[int]) -> np.ndarray:
        """Append tokens (documents with the EOS after each already in place); return
        the windows now complete, shape [n, length], int32."""
        self.tokens += len(stream)
        buf = np.concatenate([self.pending, np.asarray(stream, np.int32)])
        stride = self.length - self.overlap
        n = (len(buf) - self.length) // stride + 1 if len(buf) >= self.length else 0
        if n == 0:
            self.pending = buf
            return np.empty((0, self.length), np.int32)
        starts = np.arange(n) * stride
        windows = buf[starts[:, None] + np.arange(self.length)]
        self.pending = buf[n * stride :]
        self.windows += n
        return windows

    @property
    def dropped(self) -> int:
        """Tokens at the end of the stream that no window holds."""
        repeated = self.overlap if self.windows else 0
        return max(len(self.pending) - repeated, 0)
