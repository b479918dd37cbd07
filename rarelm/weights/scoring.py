"""One sampling weight per training sample, from a score of how rare its content is (the `weights` stage).

A sample is `rarelm.artifacts.tokenized.Samples` window i; its targets are its last
`block_size` tokens (every train token is a target of exactly one sample).
`weights.score` chooses what a window's score measures; its weight is that
score raised to `alpha`, so alpha = 0 gives uniform weights.

**frequency.** With p(t) = count(t) / total, the train-split unigram
probability of token t, the score is the mean inverse frequency of the targets:

    score_i = mean over targets t of 1 / p(t)
    log w_i = alpha * log score_i = alpha * (logsumexp_t(-log p(t)) - log block_size)

(an arithmetic mean, so one rare token in a window counts; a geometric mean
would average it away over 128 tokens). Computed in log space, so no 1 / p
overflows.

**terms.** The score grows with the rarity of the extracted terms the window
holds (data/rare/term_index.npy: an occurrence belongs to the window whose
targets include its first token), so the extra draws go to domain terms, not to
numbers and one-off words that merely have rare tokens:

    score_i = term_floor + sum over occurrences o in window i of 1 / n(term of o) ** term_beta

with n(term) its occurrences in the train split. term_floor keeps every window
reachable; term_beta > 0 favours the rarest terms. Worked example: block 4,
a window holding one occurrence of a term seen 2 times and one of a term seen
100 times, another holding none; term_beta 1, term_floor 0.05, alpha 1:

    scores 0.05 + 1/2 + 1/100 = 0.56 and 0.05   ->   weights 0.56 / 0.305 = 1.836, 0.164

The log weights are then clipped to a band of width log(clip_ratio) centred on
their median (so max / min <= clip_ratio and a handful of samples cannot take
over), exponentiated after subtracting the largest one, and normalised to mean 1:

    >>> counts = np.array([6, 2])       # p = 0.75, 0.25
    >>> w = sample_weights(np.array([0, 0, 0, 1, 1]), counts, block_size=2, alpha=1.0,
    ...                    clip_ratio=100.0, chunk_tokens=1024)
    >>> w.round(4).tolist()             # targets [0, 0] and [1, 1]: scores 4/3 and 4
    [0.5, 1.5]
    >>> index = np.array([[1, 1, 0], [3, 1, 1]])   # (start, length, term) rows
    >>> s = term_log_scores(index, np.array([2, 100]), n_windows=2, block_size=4, beta=1.0, floor=0.05)
    >>> weights_from_scores(s, 1.0, 100.0).round(3).tolist()
    [1.836, 0.164]

Samples are scored chunk by chunk (`weights.chunk_tokens` tokens or index
rows), so memory is bounded by the chunk plus the output (8 bytes per sample).
"""

from __future__ import annotations

import math

import numpy as np

from rarelm.artifacts.tokenized import Samples
from rarelm.errors import RarelmError


def sample_chunks(tokens: np.ndarray, block_size: int, chunk_tokens: int):
    """(first sample, targets [samples, block_size]) per chunk of about chunk_tokens tokens."""
    n = len(Samples(tokens, block_size))
    per_chunk = max(1, chunk_tokens // block_size)
    for first in range(0, n, per_chunk):
        last = min(n, first + per_chunk)
        targets = np.asarray(tokens[first * block_size + 1:last * block_size + 1])
        yield first, targets.reshape(last - first, block_size)


def log_scores(tokens: np.ndarray, counts: np.ndarray, block_size: int, chunk_tokens: int) -> np.ndarray:
    """log(mean over targets of 1 / p(t)) of every sample, float64 [samples]."""
    counts = np.asarray(counts, dtype=np.int64)
    total = counts.sum()
    with np.errstate(divide="ignore"):
        surprisal = np.log(total) - np.log(counts.astype(np.float64))  # inf where count is 0
    out = np.empty(len(Samples(tokens, block_size)), dtype=np.float64)
    for first, targets in sample_chunks(tokens, block_size, chunk_tokens):
        if counts[targets].min() == 0:
            raise RarelmError("a train token has count 0 in data/rare/counts.npy: the counts do not "
                              "match the tokenized data; re-run rare_terms")
        s = surprisal[targets]
        top = s.max(axis=1)
        out[first:first + len(targets)] = top + np.log(np.exp(s - top[:, None]).mean(axis=1))
    return out


def weights_from_scores(log_score: np.ndarray, alpha: float, clip_ratio: float) -> np.ndarray:
    """exp(alpha * log_score), clipped around the median to max/min <= clip_ratio, mean 1."""
    if alpha < 0:
        raise RarelmError(f"alpha = {alpha:g} is not allowed (must be >= 0)")
    if clip_ratio < 1:
        raise RarelmError(f"weights.clip_ratio = {clip_ratio:g} is not allowed (must be >= 1)")
    if len(log_score) == 0:
        raise RarelmError("the train split holds no complete sample; lower model.block_size")
    log_w = alpha * np.asarray(log_score, dtype=np.float64)
    centre = float(np.median(log_w))
    half = math.log(clip_ratio) / 2
    np.clip(log_w, centre - half, centre + half, out=log_w)
    w = np.exp(log_w - log_w.max())
    return w / w.mean()


def term_log_scores(index: np.ndarray, term_counts: np.ndarray, n_windows: int, block_size: int,
                    beta: float, floor: float, chunk_rows: int = 1 << 22) -> np.ndarray:
    """log(term_floor + sum of 1 / n(term) ** beta over the window's term occurrences), float64 [windows]."""
    if floor <= 0:
        raise RarelmError(f"weights.term_floor = {floor:g} is not allowed (must be > 0)")
    score = np.full(n_windows, float(floor))
    per_term = np.maximum(np.asarray(term_counts, dtype=np.float64), 1.0) ** -float(beta)
    for lo in range(0, len(index), chunk_rows):
        rows = np.asarray(index[lo:lo + chunk_rows])
        window = occurrence_windows(rows[:, 0], block_size)
        inside = window < n_windows  # the tail past the last whole window is never a target
        np.add.at(score, window[inside], per_term[rows[inside, 2]])
    return np.log(score)


def occurrence_windows(starts: np.ndarray, block_size: int) -> np.ndarray:
    """The window whose targets hold each occurrence's first token (position 0 is no target: window 0)."""
    return np.maximum(np.asarray(starts, dtype=np.int64) - 1, 0) // block_size


def sample_weights(tokens: np.ndarray, counts: np.ndarray, block_size: int, alpha: float,
                   clip_ratio: float, chunk_tokens: int) -> np.ndarray:
    """The weight of every training sample (module docstring), float64 [samples], mean 1."""
    return weights_from_scores(log_scores(tokens, counts, block_size, chunk_tokens), alpha, clip_ratio)


def alpha_at(schedule: str, alpha: float, epoch: int, n_epochs: int) -> float:
    """The alpha of `epoch` in a run of `n_epochs` epochs under `weights.schedule`.

    constant: `alpha` every epoch. decay: the straight line from `alpha` at the start
    of training to 0 at its end; grow: from 0 to `alpha`. Each epoch takes the
    line's value at its middle (so both average alpha / 2 over the run); an epoch
    past the last keeps the last one's value.

    >>> [round(alpha_at("decay", 0.8, e, 4), 3) for e in range(5)]
    [0.7, 0.5, 0.3, 0.1, 0.1]
    >>> [round(alpha_at("grow", 0.8, e, 4), 3) for e in range(4)], alpha_at("constant", 0.8, 3, 4)
    ([0.1, 0.3, 0.5, 0.7], 0.8)
    """
    if schedule == "constant":
        return alpha
    if schedule not in ("decay", "grow"):
        raise RarelmError(f"weights.schedule = {schedule!r} is not allowed "
                          "(must be constant, decay or grow)")
    n_epochs = max(1, n_epochs)
    progress = (min(epoch, n_epochs - 1) + 0.5) / n_epochs
    return alpha * (1.0 - progress if schedule == "decay" else progress)
