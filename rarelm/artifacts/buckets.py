"""The `rare_terms` stage's token counts and frequency buckets, and the unigram prior.

data/rare/counts.npy holds every vocabulary id's occurrences in the train
split (int64), data/rare/buckets.npy its bucket (int8): FREQUENT (0), MEDIUM
(1), RARE (2) or UNSEEN (3); `rarelm.rare_terms.buckets` gives the rule.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rarelm.files import load_array

FREQUENT, MEDIUM, RARE, UNSEEN = 0, 1, 2, 3
BUCKET_NAMES = ("frequent", "medium", "rare", "unseen")

_VOCAB_MISMATCH = "for this tokenized data; it does not match the vocabulary"


def load_buckets(rare_dir: str | Path, vocab_size: int) -> np.ndarray:
    """data/rare/buckets.npy (int8 [vocab_size], FREQUENT..UNSEEN), checked against the vocabulary."""
    return load_array(Path(rare_dir) / "buckets.npy", np.int8, vocab_size, "rare_terms", _VOCAB_MISMATCH)


def load_counts(rare_dir: str | Path, vocab_size: int) -> np.ndarray:
    """data/rare/counts.npy (int64 [vocab_size]), checked against the vocabulary."""
    return load_array(Path(rare_dir) / "counts.npy", np.int64, vocab_size, "rare_terms", _VOCAB_MISMATCH)


def log_prior(counts: np.ndarray) -> np.ndarray:
    """log pi: the train unigram prior with add-one smoothing, float64 [vocab_size].

    pi_v = (count_v + 1) / (N + V), so a token never seen in train has a finite log prior
    (logit adjustment subtracts or adds tau * log pi, which must not be infinite).

    >>> np.round(log_prior(np.array([3, 0, 1])), 4).tolist()  # (4, 1, 2) / 7
    [-0.5596, -1.9459, -1.2528]
    """
    counts = np.asarray(counts, dtype=np.float64)
    return np.log(counts + 1.0) - np.log(counts.sum() + len(counts))
