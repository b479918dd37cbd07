"""The `weights` stage: every training sample's weight, and what the weights do to exposure
(see stages/weights.py; the formulas are in `rarelm.weights.scoring`).

`run` checks the glossary's terms, computes (`compute`) and writes the stage's outputs together;
`summary` is its line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from rarelm.artifacts.buckets import BUCKET_NAMES, RARE, load_buckets, load_counts
from rarelm.artifacts.term_index import TermIndex
from rarelm.artifacts.tokenized import Samples, TokenizedData
from rarelm.errors import RarelmError
from rarelm.files import atomic_dir, outputs_together, write_csv, write_json
from rarelm.rare_terms.term_search import band_index, band_label
from rarelm.weights.scoring import (
    log_scores,
    occurrence_windows,
    sample_chunks,
    term_log_scores,
    weights_from_scores,
)


def run(params, tokenized: Path, rare_dir: Path, out: Path, metrics: Path, plot: Path) -> dict:
    """Write out/{weights,scores}.npy and out/summary.json, the same stats to `metrics` and the
    histogram to `plot`, together; returns the stats. `params` is the full Params."""
    check_term_lengths(rare_dir / "terms.jsonl", params.model.block_size)
    values, scores, stats, histogram = compute(params, tokenized, rare_dir)
    with outputs_together():  # the three outputs change together, or none does
        with atomic_dir(out) as tmp:
            np.save(tmp / "weights.npy", values)
            np.save(tmp / "scores.npy", scores)
            write_json(tmp / "summary.json", stats)
        write_json(metrics, stats)
        write_csv(plot, ["log10_weight", "samples"], histogram, cell=str)  # bins rounded to 6 decimals
    return stats


def summary(stats: dict) -> str:
    """The stage's one summary line."""
    rare, terms = stats["rare_exposure"], stats["term_exposure"]["le8"]["exposure"]
    return (f"weights: {stats['samples']} samples, score {stats['score']}, alpha {stats['alpha']:g}, max/min "
            f"{stats['max_over_min']:.3g}, ESS {stats['ess_fraction']:.1%}, rare-token exposure "
            f"{'n/a' if rare is None else f'{rare:.3f}x'}, terms seen <= 8 times "
            f"{'n/a' if terms is None else f'{terms:.2f}x'}, top 1% hold {stats['top1pct_weight_share']:.1%}")


def check_term_lengths(terms: Path, block_size: int) -> None:
    """Refuse a glossary term longer than `evaluate` can test in model.block_size tokens: a prompt
    of at least one token, then room for the term twice plus 4 (rarelm/evaluate/splits.py). Was
    refused only by evaluate, after training, in a line that did not name it. (Here, not in
    rare_terms: this stage declares model.block_size, rare_terms does not.) It reads terms.jsonl
    itself, not through rarelm.artifacts.terms: `Term` has no token ids, and a missing or malformed
    file is `compute`'s to refuse, in its own line."""
    most = (block_size - 5) // 2
    try:
        rows = [json.loads(line) for line in terms.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError):
        return  # missing or malformed: `compute` says so in its own line
    for row in rows:
        lengths = [len(ids) for ids in row.get("token_ids") or []] if isinstance(row, dict) else []
        if row.get("source") == "glossary" and lengths and min(lengths) > most:
            term = str(row.get("term", ""))
            shown = term if len(term) <= 60 else term[:57] + "..."
            raise RarelmError(
                f"rare.glossary: the term {shown!r} is {min(lengths)} tokens long; evaluate tests terms "
                f"of at most {most} tokens with model.block_size = {block_size} (a prompt, then the term "
                "twice); shorten or remove it, then re-run rare_terms")


def compute(params, tokenized_dir: Path, rare_dir: Path) -> tuple[np.ndarray, np.ndarray, dict, list[dict]]:
    """The whole stage: (weights, log scores, metrics, histogram rows); `params` is the full Params."""
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
    for first, targets in sample_chunks(tokens, block_size, chunk_tokens):
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


def term_exposure(weights: np.ndarray, index: np.ndarray, term_counts: np.ndarray, block_size: int,
                  chunk_rows: int = 1 << 22) -> dict:
    """Exposure of term occurrences per train-count band, relative to uniform sampling.

    A band's exposure is the mean weight of the windows holding its occurrences
    (weights have mean 1, so 1.0 = as often as under uniform sampling). Bands
    are those of the evaluation (rarelm.rare_terms.term_search.band_label): "2-3", "4-7", ...
    Also `le8`: all terms seen at most 8 times.
    """
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
