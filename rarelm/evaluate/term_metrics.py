"""metrics/eval.json's term figures and plots/eval_term_bands.csv, from the per-occurrence rows alone
(rarelm.evaluate.term_generation writes them; `rarelm compare` reads the same rows)."""

from __future__ import annotations

import math

import numpy as np

from rarelm.rare_terms import term_search

# Train-count strata of the terms (issue 39): unseen or seen once (0-1: the model must spell a term it
# has (almost) never been shown), rare (2-15), and common (16+). (label, key suffix, lowest, highest)
STRATA = (("0-1", "0-1", 0, 1), ("2-15", "2-15", 2, 15), ("16+", "16_up", 16, None))


def stratum(count: int) -> str:
    """The train-count stratum label of a term seen `count` times in the train split.

    >>> [stratum(c) for c in (0, 1, 2, 15, 16, 900)]
    ['0-1', '0-1', '2-15', '2-15', '16+', '16+']
    """
    return next(label for label, _, lo, hi in STRATA if count >= lo and (hi is None or count <= hi))


def _mean(values) -> float | None:
    values = [float(v) for v in values if v is not None]
    return sum(values) / len(values) if values else None


def em50_train_count(counts: np.ndarray, hits: np.ndarray) -> float | None:
    """Train occurrences at which a logistic fit of exact match on log2(train count) crosses 0.5.

    Fits P(hit) = 1 / (1 + exp(-(a + b log2 count))) by Newton's method (with a
    1e-6 ridge so a perfect separation stays finite) over occurrences of terms seen
    at least once, and returns 2^(-a/b). Undefined (None) when the fit does not rise
    with the count (b <= 0), or when the crossing lies outside the counts observed
    (it would be an extrapolation), or with fewer than two distinct counts.

    >>> c = np.array([1, 2, 4, 8, 16, 32, 64, 128] * 4)
    >>> round(em50_train_count(c, c >= 16), 1)   # hits from 16 on: the crossing is half way, at ~11
    11.3
    """
    keep = counts >= 1
    x, y = np.log2(counts[keep].astype(np.float64)), hits[keep].astype(np.float64)
    if len(np.unique(x)) < 2:
        return None
    design = np.stack([np.ones_like(x), x], axis=1)
    w = np.zeros(2)
    for _ in range(100):
        p = 0.5 * (1.0 + np.tanh(0.5 * (design @ w)))  # the logistic function, without overflow
        grad = design.T @ (y - p) - 1e-6 * w
        hess = design.T @ (design * (p * (1 - p))[:, None]) + 1e-6 * np.eye(2)
        step = np.linalg.solve(hess, grad)
        w += step
        if np.abs(step).max() < 1e-10:
            break
    a, b = w
    if b <= 0:
        return None
    crossing = -a / b
    if not x.min() <= crossing <= x.max():
        return None
    return float(2.0 ** crossing)


def term_ppl(nll: float | None) -> float | None:
    """Term perplexity: exp of the mean NLL per term token (mean over occurrences of each occurrence's
    mean per covering token). Two occurrences of 2 and 1 tokens with NLL (ln 2, ln 8) and (ln 4):
    per-token means ln 4 and ln 4, so the term perplexity is 4.

    >>> term_ppl((math.log(16) / 2 + math.log(4)) / 2)
    4.0
    """
    return None if nll is None else math.exp(nll)


def _figures(rows: list[dict]) -> dict:
    """Means over some rows: exact match (as written, and in any case), completion exact match given
    the first token, first-token accuracy, NLL (per token, per term, per character) and term perplexity,
    term-token accuracy, first-token reciprocal rank and closed-set choice."""
    nll = _mean(r["nll"] for r in rows)
    return {"exact_match": _mean(r["exact_match"] for r in rows),
            "completion_match": _mean(r.get("completion_match") for r in rows),  # None: rows from before it
            "exact_match_ci": _mean(r.get("exact_match_ci") for r in rows),  # None: rows from before it
            "prefix_share": _mean(r.get("prefix_share") for r in rows),  # None: rows from before it
            "first_token_acc": _mean(r["first_token_hit"] for r in rows),
            "nll": nll,
            "ppl": term_ppl(nll),
            "nll_per_term": _mean(r.get("nll_sum") for r in rows),
            "nll_per_char": _mean(r.get("nll_per_char") for r in rows),
            "token_acc": _mean(r.get("token_acc") for r in rows),
            "first_token_mrr": _mean(r.get("first_token_rr") for r in rows),
            "choice_acc": _mean(None if r["choice_rank"] is None else r["choice_rank"] == 1 for r in rows)}


def term_metrics(rows: list[dict], n_terms: int, n_occurrences: int) -> dict:
    """metrics/eval.json's term figures, from the per-occurrence rows alone.

    Each figure is a mean over occurrences; `*_macro` first averages each term's
    occurrences, then the terms. `_first` / `_repeat` split by mention type;
    `_band_<lo-hi>` by the term's train count; `_le15` keeps terms seen <= 15 times; `_seen_0-1`,
    `_seen_2-15`, `_seen_16_up` are the strata of STRATA (terms unseen or seen once in train, 2-15
    times, 16 times or more). `term_ppl` = exp(`term_nll`), the term perplexity;
    `term_completion_match`: exact match when the term's first token is given (see term_generation).
    `term_exact_match_ci` is exact match compared case folded (" Pki" for " PKI").
    `term_prefix_share`: the share of the term's characters written right before the first wrong
    one (term_generation.prefix_share), exact match graded by character.
    """
    def block(subset: list[dict], suffix: str) -> dict:
        out = {f"term_{key}{suffix}": value for key, value in _figures(subset).items()}
        return {**out, f"n_eval_terms{suffix}": len(subset)}

    out = block(rows, "")
    by_term: dict[str, list[dict]] = {}
    for r in rows:
        by_term.setdefault(r["term"], []).append(r)
    per_term = [_figures(group) for group in by_term.values()]
    for key in ("exact_match", "first_token_acc", "choice_acc", "nll_per_char", "token_acc"):
        out[f"term_{key}_macro"] = _mean(m[key] for m in per_term)
    ranks = [r["first_token_rank"] for r in rows if r.get("first_token_rank") is not None]
    out["term_first_token_rank_median"] = float(np.median(ranks)) if ranks else None
    for mention in ("first", "repeat"):
        out.update(block([r for r in rows if r["mention"] == mention], f"_{mention}"))
    out.update(block([r for r in rows if r["train_count"] <= 15], "_le15"))
    for label, suffix, _, _ in STRATA:
        out.update(block([r for r in rows if stratum(r["train_count"]) == label], f"_seen_{suffix}"))
    for label, subset in _by_band(rows):
        figures = _figures(subset)
        out[f"term_exact_match_band_{label}"] = figures["exact_match"]
        out[f"term_exact_match_ci_band_{label}"] = figures["exact_match_ci"]
        out[f"term_choice_acc_band_{label}"] = figures["choice_acc"]
        out[f"n_eval_terms_band_{label}"] = len(subset)
    counts = np.array([r["train_count"] for r in rows], dtype=np.int64)
    out["em50_train_count"] = em50_train_count(counts, np.array([r["exact_match"] for r in rows], bool))
    out["n_eval_term_types"] = len(by_term)
    out["n_term_occurrences"] = n_occurrences  # found in the split, before the eval.max_terms cap
    # the scored occurrences that repeat a term already in their document (the case a cache copies)
    repeats = sum(r["mention"] == "repeat" for r in rows)
    out["term_repeat_share"] = repeats / len(rows) if rows else None
    out["n_terms"] = n_terms
    return out


def _by_band(rows: list[dict]) -> list[tuple[str, list[dict]]]:
    """(band label, its rows) for each train-count band that has rows, in band order."""
    bands: dict[int, list[dict]] = {}
    for r in rows:
        bands.setdefault(term_search.band_index(r["train_count"]), []).append(r)
    return [(term_search.band_label(group[0]["train_count"]), group) for _, group in sorted(bands.items())]


def band_rows(rows: list[dict]) -> list[dict]:
    """plots/eval_term_bands.csv: one row per train-count band."""
    return [{"band": term_search.frequency_band(group[0]["train_count"]),
             "terms": len({r["term"] for r in group}), "occurrences": len(group), **_figures(group)}
            for _, group in _by_band(rows)]
