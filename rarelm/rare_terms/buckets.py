"""Token frequencies and frequency buckets (the `rare_terms` stage).

**Frequencies** are counted over the train split's token array chunk by chunk
(`np.bincount` per chunk of `rare.chunk_tokens` tokens), so memory is bounded
by the chunk and the vocabulary, not the corpus.

**Buckets.** Every vocabulary id gets one of FREQUENT (0), MEDIUM (1), RARE (2)
or UNSEEN (3, count 0 in train). Buckets are count ranges, so tokens with equal
counts always share a bucket (that is the whole tie rule):

* frequent: count >= c_f, where c_f is the count of the token at which the
  running share of occurrences, tokens taken from the most frequent down,
  first reaches `frequent_share` (so frequent tokens cover at least that share);
* rare: 0 < count <= c_r, where c_r is the largest count such that all seen
  tokens with count <= c_r together cover at most `rare_share` of occurrences;
* medium: every other seen token (c_r < count < c_f).

A bucket left empty by the thresholds is an error, never a silent empty group.

    >>> counts = np.array([0, 50, 30, 10, 5, 3, 2])   # 100 occurrences, id 0 unseen
    >>> bucket_tokens(counts, frequent_share=0.8, rare_share=0.1)[0].tolist()
    [3, 0, 0, 1, 2, 2, 2]
"""

from __future__ import annotations

import numpy as np

from rarelm.artifacts.buckets import BUCKET_NAMES, FREQUENT, MEDIUM, RARE, UNSEEN
from rarelm.errors import RarelmError


def count_tokens(tokens: np.ndarray, vocab_size: int, chunk_tokens: int) -> np.ndarray:
    """Occurrences of every id in `tokens`, int64 [vocab_size], counted chunk by chunk."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for start in range(0, len(tokens), chunk_tokens):
        chunk = np.asarray(tokens[start:start + chunk_tokens])
        found = np.bincount(chunk, minlength=vocab_size)
        if len(found) > vocab_size:
            bad = int(chunk.max())
            raise RarelmError(
                f"token id {bad} in the train split is outside the vocabulary of {vocab_size} "
                "ids: the tokenized data and its tokenizer do not match; re-run the tokenize stage")
        counts += found
    return counts


def bucket_tokens(counts: np.ndarray, frequent_share: float, rare_share: float) -> tuple[np.ndarray, dict]:
    """Buckets (int8 [vocab]) by the count-range rule of the module docstring, and a summary."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        raise RarelmError("rare_terms: the train split has no tokens to count")
    seen = np.sort(counts[counts > 0])  # ascending
    running_desc = np.cumsum(seen[::-1])
    # first position (from the top) where the running share reaches frequent_share
    at = int(np.searchsorted(running_desc, frequent_share * total, side="left"))
    frequent_min = int(seen[::-1][min(at, len(seen) - 1)])
    # occurrences of all tokens with count <= c, for each distinct count c (ascending)
    levels, first = np.unique(seen, return_index=True)
    covered = np.cumsum(seen)[np.r_[first[1:], len(seen)] - 1]
    within = levels[covered <= rare_share * total]
    rare_max = int(within[-1]) if len(within) else 0

    buckets = np.full(len(counts), MEDIUM, dtype=np.int8)
    buckets[counts >= frequent_min] = FREQUENT
    buckets[(counts > 0) & (counts <= rare_max)] = RARE
    buckets[counts == 0] = UNSEEN
    summary = {"total_occurrences": total, "vocab_size": int(len(counts)),
               "frequent_min_count": frequent_min, "rare_max_count": rare_max}
    for code, name in enumerate(BUCKET_NAMES):
        members = buckets == code
        summary[name] = {"tokens": int(members.sum()),
                         "occurrences": int(counts[members].sum()),
                         "share": float(counts[members].sum() / total)}
    for code in (FREQUENT, MEDIUM, RARE):
        if summary[BUCKET_NAMES[code]]["tokens"] == 0:
            raise RarelmError(
                f"rare: frequent_share = {frequent_share:g} and rare_share = {rare_share:g} leave the "
                f"{BUCKET_NAMES[code]} bucket empty (counts range {int(seen[0])}..{int(seen[-1])}); "
                + ("raise rare_share" if code == RARE else
                   "lower frequent_share or rare_share" if code == MEDIUM else "raise frequent_share"))
    return buckets, summary
