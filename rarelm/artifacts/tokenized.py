"""Reading the tokenized corpus and its tokenizer, and what one training sample is.

`TokenizedData` opens the `tokenize` stage's folder; token arrays are
memory-mapped, so opening costs nothing and reading touches only what is read.

A training sample is a window of `block_size + 1` tokens (inputs and their
next-token targets). The base windows, `Samples`, start at multiples of
`block_size` and overlap by one token, so every token is a target exactly once;
the `weights` stage scores them, so weight i always belongs to base window i:

    >>> windows = Samples(np.arange(10), block_size=4)
    >>> len(windows), windows[1].tolist()
    (2, [4, 5, 6, 7, 8])

Training moves the boundaries each epoch (`rarelm.train.sampler`): at offset o the
windows start at o + k * block_size, each straddling base windows k and k + 1,
and the loop reads them by start position (`rarelm.train.batches.to_batch`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from rarelm.errors import RarelmError
from rarelm.files import read_json


@dataclasses.dataclass(frozen=True)
class TokenizedData:
    root: Path
    meta: dict

    @classmethod
    def open(cls, root: str | Path) -> TokenizedData:
        root = Path(root)
        try:
            meta = read_json(root / "meta.json")
        except FileNotFoundError:
            raise RarelmError(f"{root}: no meta.json; run the tokenize stage first") from None
        return cls(root, meta)

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    @property
    def eot_id(self) -> int:
        return int(self.meta["eot_id"])

    @property
    def tokenizer_dir(self) -> Path:
        return self.root / "tokenizer"

    def tokens(self, split: str) -> np.ndarray:
        """The split's token ids, memory-mapped read-only; checked against meta.json."""
        path = self.root / f"{split}.tokens"
        expected = int(self.meta["splits"][split]["tokens"])
        dtype = np.dtype(self.meta["dtype"])
        size = path.stat().st_size if path.exists() else -1
        if size != expected * dtype.itemsize:
            raise RarelmError(
                f"{path}: {size} bytes, but meta.json says {expected} {dtype.name} tokens "
                f"({expected * dtype.itemsize} bytes); re-run the tokenize stage")
        if expected == 0:
            return np.zeros(0, dtype=dtype)
        return np.memmap(path, dtype=dtype, mode="r")

    def offsets(self, split: str) -> np.ndarray:
        """Document boundaries: document i is tokens[off[i]:off[i+1]]."""
        return np.load(self.root / f"{split}.offsets.npy")


class Samples:
    """The base windows over a token array: window i starts at i * block_size (module docstring)."""

    def __init__(self, tokens: np.ndarray, block_size: int):
        self.tokens = tokens
        self.block_size = block_size

    def __len__(self) -> int:
        return max(0, (len(self.tokens) - 1) // self.block_size)

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < len(self):
            raise IndexError(i)
        start = i * self.block_size
        return self.tokens[start:start + self.block_size + 1]


def lead_ids(tokenizer: Tokenizer) -> list[int]:
    """The tokens the tokenizer puts before any text: `<bos>` for Gemma 3 (its post-processor's), none
    for GPT-2-style tokenizers (SmolLM2's, the pipeline's own BPE). The tokenize stage leaves them out
    (documents and end-of-text tokens only); evaluate and the datastore put them before every window
    and prompt, as the model was trained (rarelm/evaluate/prefix.py)."""
    encoding = tokenizer.encode("a")
    added = encoding.special_tokens_mask  # 1 where the post-processor added a token
    first = added.index(0) if 0 in added else len(added)
    return encoding.ids[:first]


def load_tokenizer(tokenizer_dir: Path, vocab_size: int | None) -> Tokenizer:
    """The pipeline's tokenizer (tokenizers.Tokenizer), checked against the tokenized data's
    vocabulary (None: not checked, for what does not encode text with it, such as its lead)."""
    path = tokenizer_dir / "tokenizer.json"
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a plain Exception for a missing or bad file
        raise RarelmError(f"{path}: not a readable tokenizer ({' '.join(str(exc).split())[:200]}); "
                          "re-run the tokenize stage") from None
    if vocab_size is not None and tokenizer.get_vocab_size() != vocab_size:
        raise RarelmError(
            f"{path}: vocabulary of {tokenizer.get_vocab_size()} tokens, but the tokenized data "
            f"says {vocab_size}; the vocabulary does not match the tokenized data, re-run tokenize")
    return tokenizer
