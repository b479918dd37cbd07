"""One sampling weight per training sample, from its tokens' frequencies (the `weights` stage).

A sample is `rarelm.data.Samples` window i; its targets are its last
`block_size` tokens (every train token is a target of exactly one sample).
With p(t) = count(t) / total, the train-split unigram probability of token t,
a sample's score is the mean inverse frequency of its targets, and its weight
is that score raised to `alpha`:

    score_i = mean over targets t of 1 / p(t)
    log w_i = alpha * log score_i = alpha * (logsumexp_t(-log p(t)) - log block_size)

so alpha = 0 gives uniform weights and a larger alpha favours samples holding
rare tokens (an arithmetic mean, so one rare token in a window counts; a
geometric mean would average it away over 128 tokens). Everything is computed
in log space (logsumexp), so no 1 / p overflows. The log weights are then
clipped to a band of width log(clip_ratio) centred on their median (so
max / min <= clip_ratio and a handful of samples cannot take over),
exponentiated after subtracting the largest one, and normalised to mean 1:

    >>> counts = np.array([6, 2])       # p = 0.75, 0.25
    >>> w = sample_weights(np.array([0, 0, 0, 1, 1]), counts, block_size=2, alpha=1.0,
    ...                    clip_ratio=100.0, chunk_tokens=1024)
    >>> w.round(4).tolist()             # targets [0, 0] and [1, 1]: scores 4/3 and 4
    [0.5, 1.5]

Samples are scored chunk by chunk (`weights.chunk_tokens` tokens), so memory is
bounded by the chunk plus the output (8 bytes per sample).
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


def compute(params, tokenized_dir: Path, rare_dir: Path) -> tuple[np.ndarray, dict, list[dict]]:
    """The whole stage: (weights, metrics, histogram rows); `params` is the full Params."""
    from rarelm.data import TokenizedData
    from rarelm.rare import load_buckets, load_counts

    if params.alpha < 0:
        raise RarelmError(f"alpha = {params.alpha:g} is not allowed (must be >= 0)")
    data = TokenizedData.open(tokenized_dir)
    tokens = data.tokens("train")
    counts = load_counts(rare_dir, data.vocab_size)
    buckets = load_buckets(rare_dir, data.vocab_size)
    if int(counts.sum()) != len(tokens):
        raise RarelmError(
            f"{rare_dir}/counts.npy: counts sum to {int(counts.sum())} tokens, but the train split has "
            f"{len(tokens)}; it does not match the tokenized data, re-run rare_terms")
    block, chunk = params.model.block_size, params.weights.chunk_tokens
    weights = sample_weights(tokens, counts, block, params.alpha, params.weights.clip_ratio, chunk)
    stats = weight_stats(weights, tokens, buckets, block, chunk)
    return weights, {"alpha": params.alpha, **stats}, histogram_rows(weights)
