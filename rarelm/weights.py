"""One sampling weight per training sample, from a score of how rare its content is (the `weights` stage).

A sample is `rarelm.data.Samples` window i; its targets are its last
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
from pathlib import Path

import numpy as np

from rarelm.data import Samples
from rarelm.errors import RarelmError
from rarelm.files import load_array
from rarelm.rare import BUCKET_NAMES, RARE


def _sample_chunks(tokens: np.ndarray, block_size: int, chunk_tokens: int):
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
    for first, targets in _sample_chunks(tokens, block_size, chunk_tokens):
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


def term_exposure(weights: np.ndarray, index: np.ndarray, term_counts: np.ndarray, block_size: int,
                  chunk_rows: int = 1 << 22) -> dict:
    """Exposure of term occurrences per train-count band, relative to uniform sampling.

    A band's exposure is the mean weight of the windows holding its occurrences
    (weights have mean 1, so 1.0 = as often as under uniform sampling). Bands
    are those of the evaluation (term_search.band_label): "2-3", "4-7", ...
    Also `le8`: all terms seen at most 8 times.
    """
    from rarelm.term_search import band_index, band_label

    counts = np.asarray(term_counts, dtype=np.int64)
    bands = np.array([band_index(c) for c in counts.tolist()], dtype=np.int64)
    top = int(bands.max(initial=0)) + 1
    weighted, plain = np.zeros(top + 1), np.zeros(top + 1)  # the last slot: terms seen <= 8 times
    for lo in range(0, len(index), chunk_rows):
        rows = np.asarray(index[lo:lo + chunk_rows])
        window = occurrence_windows(rows[:, 0], block_size)
        inside = window < len(weights)
        w, term = weights[window[inside]], rows[inside, 2]
        weighted[:top] += np.bincount(bands[term], weights=w, minlength=top)
        plain[:top] += np.bincount(bands[term], minlength=top)
        rare = counts[term] <= 8
        weighted[top] += w[rare].sum()
        plain[top] += rare.sum()
    exposure = {band_label(1 << (b - 1) if b else 0): {"occurrences": int(plain[b]),
                                                      "exposure": float(weighted[b] / plain[b])}
                for b in range(top) if plain[b]}
    exposure["le8"] = {"occurrences": int(plain[top]),
                       "exposure": float(weighted[top] / plain[top]) if plain[top] else None}
    return exposure


def sample_weights(tokens: np.ndarray, counts: np.ndarray, block_size: int, alpha: float,
                   clip_ratio: float, chunk_tokens: int) -> np.ndarray:
    """The weight of every training sample (module docstring), float64 [samples], mean 1."""
    return weights_from_scores(log_scores(tokens, counts, block_size, chunk_tokens), alpha, clip_ratio)


def weight_stats(weights: np.ndarray, tokens: np.ndarray, buckets: np.ndarray, block_size: int,
                 chunk_tokens: int) -> dict:
    """Kish effective sample size, top-1% weight share and each bucket's exposure vs uniform.

    Exposure of a bucket = expected targets from it per drawn sample under the
    weights, divided by the same under uniform sampling: sum_i w_i n_i / sum_i n_i
    for mean-1 weights, n_i = the sample's targets in the bucket (1.0 = unchanged).
    """
    n = len(weights)
    ess = float(weights.sum() ** 2 / np.square(weights).sum())
    top = max(1, math.ceil(0.01 * n))
    top_share = float(np.sort(weights)[-top:].sum() / weights.sum())
    weighted = np.zeros(len(BUCKET_NAMES))
    plain = np.zeros(len(BUCKET_NAMES))
    for first, targets in _sample_chunks(tokens, block_size, chunk_tokens):
        per_sample = np.stack([(buckets[targets] == b).sum(axis=1) for b in range(len(BUCKET_NAMES))])
        weighted += per_sample @ weights[first:first + len(targets)]
        plain += per_sample.sum(axis=1)
    exposure = {name: (float(weighted[b] / plain[b]) if plain[b] else None)
                for b, name in enumerate(BUCKET_NAMES[:3])}
    return {"samples": n, "ess": ess, "ess_fraction": ess / n, "top1pct_weight_share": top_share,
            "rare_exposure": exposure[BUCKET_NAMES[RARE]],
            "exposure": exposure,
            "max_over_min": float(weights.max() / weights.min()),
            "min": float(weights.min()), "max": float(weights.max())}


def histogram_rows(weights: np.ndarray, bins: int = 40) -> list[dict]:
    """A histogram of log10 weights: rows {log10_weight: bin centre, samples: count}."""
    log_w = np.log10(weights)
    counts, edges = np.histogram(log_w, bins=bins)
    centres = (edges[:-1] + edges[1:]) / 2
    return [{"log10_weight": round(float(c), 6), "samples": int(k)}
            for c, k in zip(centres, counts, strict=True)]


def load_weights(path: str | Path, n_samples: int) -> np.ndarray:
    """data/weights/weights.npy (float64 [n_samples], finite, > 0), checked against the samples."""
    w = load_array(path, np.float64, n_samples, "weights",
                   "(one weight per training sample); it does not match the tokenized data")
    if not (np.isfinite(w).all() and (w > 0).all()):
        raise RarelmError(f"{path}: holds a weight that is not finite and > 0; re-run weights")
    return w


def compute(params, tokenized_dir: Path, rare_dir: Path) -> tuple[np.ndarray, np.ndarray, dict, list[dict]]:
    """The whole stage: (weights, log scores, metrics, histogram rows); `params` is the full Params."""
    from rarelm.data import TokenizedData
    from rarelm.rare import TermIndex, load_buckets, load_counts

    if params.alpha < 0:
        raise RarelmError(f"alpha = {params.alpha:g} is not allowed (must be >= 0)")
    wp = params.weights
    data = TokenizedData.open(tokenized_dir)
    tokens = data.tokens("train")
    counts = load_counts(rare_dir, data.vocab_size)
    buckets = load_buckets(rare_dir, data.vocab_size)
    if int(counts.sum()) != len(tokens):
        raise RarelmError(
            f"{rare_dir}/counts.npy: counts sum to {int(counts.sum())} tokens, but the train split has "
            f"{len(tokens)}; it does not match the tokenized data, re-run rare_terms")
    index = TermIndex.open(rare_dir, data)
    term_counts = index.occurrences_per_term()
    block, chunk = params.model.block_size, wp.chunk_tokens
    if wp.score == "terms":
        scores = term_log_scores(index.rows, term_counts, len(Samples(tokens, block)), block,
                                 wp.term_beta, wp.term_floor)
    else:
        scores = log_scores(tokens, counts, block, chunk)
    weights = weights_from_scores(scores, params.alpha, wp.clip_ratio)
    stats = weight_stats(weights, tokens, buckets, block, chunk)
    stats["term_exposure"] = term_exposure(weights, index.rows, term_counts, block)
    return weights, scores, {"alpha": params.alpha, "score": wp.score, **stats}, histogram_rows(weights)


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
