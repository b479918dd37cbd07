"""Reading where the terms occur in the train split (data/rare/term_index.npy), memory-mapped."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rarelm.errors import RarelmError
from rarelm.files import read_json, sha256_file

TERM_INDEX = "term_index.npy"
TERM_INDEX_META = "term_index.json"


class TermIndex:
    """data/rare/term_index.npy, memory-mapped: which train positions belong to term occurrences.

    `open` checks that it was built from the current terms.jsonl, tokenizer and
    train split. Lookups touch only the rows near the positions asked about.

        >>> index = TermIndex(np.array([[2, 2, 0], [9, 1, 1]]), max_length=2)
        >>> index.target_mask(np.array([0, 8]), block_size=4).astype(int).tolist()
        [[0, 1, 1, 0], [1, 0, 0, 0]]
    """

    def __init__(self, rows: np.ndarray, max_length: int, n_terms: int | None = None):
        self.rows = rows
        self.starts = rows[:, 0]
        self.max_length = max_length
        self.n_terms = int(rows[:, 2].max(initial=-1)) + 1 if n_terms is None else n_terms

    @classmethod
    def open(cls, rare_dir: str | Path, data) -> TermIndex:
        rare_dir = Path(rare_dir)
        try:
            meta = read_json(rare_dir / TERM_INDEX_META)
            rows = np.load(rare_dir / TERM_INDEX, mmap_mode="r")
        except (FileNotFoundError, ValueError, OSError):
            raise RarelmError(f"{rare_dir}: no readable {TERM_INDEX} (where terms occur in the train "
                              "split); re-run the rare_terms stage") from None
        stale = [what for what, ok in (
            ("terms.jsonl", (rare_dir / "terms.jsonl").is_file()
             and meta.get("terms_sha256") == sha256_file(rare_dir / "terms.jsonl")),
            ("tokenizer", meta.get("tokenizer_sha256") == sha256_file(data.tokenizer_dir / "tokenizer.json")),
            ("train split", meta.get("train_tokens") == int(data.meta["splits"]["train"]["tokens"])),
            ("row count", rows.ndim == 2 and rows.shape[1] == 3 and len(rows) == meta.get("occurrences")),
        ) if not ok]
        if stale:
            raise RarelmError(f"{rare_dir}/{TERM_INDEX} was not built from the current {stale[0]}; "
                              "re-run the rare_terms stage")
        return cls(rows, int(meta["max_length"]), int(meta["terms"]))

    def __len__(self) -> int:
        return len(self.rows)

    def overlapping(self, lo: int, hi: int) -> np.ndarray:
        """Rows of the occurrences that cover any position in [lo, hi)."""
        first = int(np.searchsorted(self.starts, lo - self.max_length + 1, side="left"))
        last = int(np.searchsorted(self.starts, hi, side="left"))
        rows = np.asarray(self.rows[first:last])
        return rows[rows[:, 0] + rows[:, 1] > lo]

    def target_mask(self, starts: np.ndarray, block_size: int, skip_first: bool = False) -> np.ndarray:
        """Bool [windows, block_size]: target j of the window starting at s (position s + 1 + j)
        is a token of a term occurrence (with `skip_first`: one after the occurrence's first).

        >>> TermIndex(np.array([[2, 2, 0]]), 2).target_mask(np.array([0]), 4, skip_first=True).tolist()
        [[False, False, True, False]]
        """
        skip = int(skip_first)
        mask = np.zeros((len(starts), block_size + 1), dtype=np.int8)
        for w, s in enumerate(np.asarray(starts, dtype=np.int64).tolist()):
            for start, length, _ in self.overlapping(s + 1, s + 1 + block_size).tolist():
                a, b = max(start + skip, s + 1) - s - 1, min(start + length, s + 1 + block_size) - s - 1
                mask[w, a] += 1
                mask[w, b] -= 1
        return np.cumsum(mask[:, :-1], axis=1) > 0

    def occurrences_per_term(self, chunk_rows: int = 1 << 22) -> np.ndarray:
        """How often each term occurs in the train split, int64 [n_terms]."""
        out = np.zeros(self.n_terms, dtype=np.int64)
        for lo in range(0, len(self.rows), chunk_rows):
            out += np.bincount(np.asarray(self.rows[lo:lo + chunk_rows, 2]), minlength=self.n_terms)
        return out
