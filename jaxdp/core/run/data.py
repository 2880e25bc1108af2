"""Training data as NumPy: the single source of batches for both frameworks.

Every batch is a pure function of (seed, step), so any process, any framework and any resumed run
sees exactly the same global batch at step k. Inputs are float64 (cast by the trainer to the run's
dtype); labels are int32.

- `synthetic`: Gaussian inputs, labels from a fixed random linear teacher (learnable, 10 classes).
- `digits`: the 8x8 handwritten digits that scikit-learn ships (1797 images, no download).
- `text`: characters of a text file shipped with the package; x is a window, y the next characters.
- `tokens`: GPT-2-sized token ids (vocabulary 50304) made by the package (`token_stream`), as text.
- `llama3-tokens`: the same, over Llama 3's vocabulary (128256): `--preset llama3-8b`'s shapes.
"""
from __future__ import annotations

import functools
import gzip
import importlib.util
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

SYNTHETIC_FEATURES = 32
SYNTHETIC_CLASSES = 10
TOKENS_VOCAB = 50304  # GPT-2's 50257 padded to a multiple of 64 (jaxdp/models/gpt2.py)
TOKENS_LENGTH = 1 << 15
TOKEN_VOCABS = {"tokens": TOKENS_VOCAB, "llama3-tokens": 128256}  # made token data: its vocabulary


@dataclass(frozen=True)
class Dataset:
    name: str
    seed: int
    n_features: int       # mlp input width; for text: the context length
    n_classes: int        # classes, or vocabulary size for text
    _inputs: np.ndarray | None = None
    _labels: np.ndarray | None = None
    _tokens: np.ndarray | None = None
    vocab: str = ""

    def batch(self, step: int, batch_size: int, rows: slice = slice(None)) -> tuple[np.ndarray, np.ndarray]:
        """The global batch of optimizer step `step` (1-based), or only its `rows` (a process of a
        multi-process run reads only the rows of its own devices)."""
        rng = np.random.default_rng([self.seed, step, 0xDA7A])
        if self.name == "synthetic":  # generated, not loaded: draw the whole batch, keep the rows
            x = rng.standard_normal((batch_size, self.n_features))[rows]
            y = np.argmax(x @ self._teacher(), axis=1).astype(np.int32)
            return x, y
        if self.name == "digits":
            n = len(self._inputs)
            idx = rng.choice(n, size=batch_size, replace=batch_size > n)[rows]
            return self._inputs[idx], self._labels[idx]
        seq_len = self.n_features
        starts = rng.integers(0, len(self._tokens) - seq_len - 1, size=batch_size)[rows]
        windows = np.stack([self._tokens[s:s + seq_len + 1] for s in starts])
        return windows[:, :-1].astype(np.int32), windows[:, 1:].astype(np.int32)

    def _teacher(self) -> np.ndarray:
        return np.random.default_rng([self.seed, 0x7EAC]).standard_normal((self.n_features, self.n_classes))


def micro_major(a: np.ndarray, parts: int, accum: int) -> np.ndarray:
    """The rows of a global batch reordered for `parts` devices (or ranks, or processes) x `accum`
    micro-batches, the one batch layout of both frameworks: micro-batch j is rows [j B/A, (j+1) B/A)
    of the batch whatever the strategy and N (`single`'s micro-batch j), and part d's share of it
    is its d-th contiguous chunk. After the reorder part d's rows are one contiguous block, its
    shares of micro-batches 0..A-1 in order (`part_rows`). With one part or one micro-batch, `a`."""
    if parts == 1 or accum == 1:
        return a
    return a.reshape(accum, parts, -1, *a.shape[1:]).swapaxes(0, 1).reshape(a.shape)


def part_rows(a: np.ndarray, part: int, parts: int, accum: int) -> np.ndarray:
    """Part `part`'s rows of the global batch `a` (its block of `micro_major`): what a torch rank, or
    a process of a multi-process JAX run, passes to its step."""
    return a.reshape(accum, parts, -1, *a.shape[1:])[:, part].reshape(-1, *a.shape[1:])


def text_corpus() -> str:
    """The character-level corpus shipped in `jaxdp/assets/` (never downloaded)."""
    return resources.files("jaxdp").joinpath("assets/data_parallel.txt").read_text(encoding="utf-8")


def token_stream(vocab: int = TOKENS_VOCAB, length: int = TOKENS_LENGTH) -> np.ndarray:
    """Made, never downloaded: a fixed stream of `length` token ids in [0, vocab) (its own seed, not the
    run's), in which each token is followed by its fixed successor (a permutation) 3 times in 4 and by
    a uniformly drawn token otherwise: learnable, and every id of GPT-2's vocabulary can occur."""
    rng = np.random.default_rng(0x70CE)
    successor, fresh = rng.permutation(vocab), rng.integers(0, vocab, length)
    jump = rng.random(length) < 0.25
    out = np.empty(length, dtype=np.int32)
    out[0] = fresh[0]
    for i in range(1, length):
        out[i] = fresh[i] if jump[i] else successor[out[i - 1]]
    return out


DIGITS_SHAPE = (1797, 65)  # scikit-learn's digits.csv.gz: 64 pixels (0-16) and the label, per image


@functools.cache
def digits() -> tuple[np.ndarray, np.ndarray]:
    """(pixels [1797, 64] float64 in 0..16, labels [1797] int32): `sklearn.datasets.load_digits`'s arrays,
    read from the file scikit-learn ships, as it reads it, without importing scikit-learn (1.3 CPU-s and a
    thread, paid by every torch rank that loads the digits); `load_digits` itself where the file is not
    found, not readable, or not the expected table."""
    spec = importlib.util.find_spec("sklearn")
    folders = list(spec.submodule_search_locations or []) if spec else []
    path = Path(folders[0], "datasets", "data", "digits.csv.gz") if folders else None
    table = None
    if path is not None and path.is_file():
        try:  # a file read like any other: unreadable or not numbers is the fallback below, not a crash
            with gzip.open(path, mode="rt", encoding="utf-8") as f:
                table = np.loadtxt(f, delimiter=",")
        except (OSError, EOFError, ValueError, UnicodeDecodeError):
            table = None
    if table is None or table.shape != DIGITS_SHAPE or not np.isin(table, np.arange(17)).all():
        from sklearn.datasets import load_digits

        found = load_digits()
        return found.data.astype(np.float64), found.target.astype(np.int32)
    return table[:, :-1], table[:, -1].astype(np.int32)


def load(name: str, seed: int, seq_len: int = 32) -> Dataset:
    if name == "synthetic":
        return Dataset(name, seed, SYNTHETIC_FEATURES, SYNTHETIC_CLASSES)
    if name == "digits":
        pixels, labels = digits()
        return Dataset(name, seed, pixels.shape[1], 10, pixels / 16.0, labels.copy())
    if name == "text":
        text = text_corpus()
        vocab = "".join(sorted(set(text)))
        lookup = {c: i for i, c in enumerate(vocab)}
        tokens = np.array([lookup[c] for c in text], dtype=np.int32)
        if len(tokens) <= seq_len + 1:
            raise ValueError(f"--seq-len {seq_len} is longer than the text corpus ({len(tokens)} characters)")
        return Dataset(name, seed, seq_len, len(vocab), _tokens=tokens, vocab=vocab)
    if name in TOKEN_VOCABS:
        tokens = token_stream(TOKEN_VOCABS[name])
        if len(tokens) <= seq_len + 1:
            raise ValueError(f"--seq-len {seq_len} is longer than the token stream ({len(tokens)} tokens)")
        return Dataset(name, seed, seq_len, TOKEN_VOCABS[name], _tokens=tokens)
    raise ValueError(f"unknown data {name!r}; valid: synthetic, digits, text, {', '.join(TOKEN_VOCABS)}")
