"""The statistics of `rarelm compare`: term x seed bootstrap intervals, the sign test over terms.

Every comparison is paired, occurrence by occurrence (see rarelm/report/compare.py); replicates
of one configuration are runs that differ only by their seed.

Why terms are resampled. The occurrences of one term are not independent: a
model that learned "myocardial infarction" writes it at all twelve of its
occurrences, one that did not misses all twelve. What we want to know is
whether a method helps on terms like these, so the unit of replication is the
term, not the occurrence. The bootstrap therefore draws terms with replacement
(as many as there are), every drawn term bringing all its occurrences, in both
configurations at once (paired), and recomputes the difference of the metric;
B = 2000 such resamples give the 2.5th and 97.5th percentiles: the 95% interval.
Resampling occurrences instead would count twelve copies of one outcome as
twelve pieces of evidence and give an interval too narrow by about the square
root of the occurrences per term.

Why seeds are resampled too (hierarchical bootstrap). Another training seed
gives another model; a method's gain measured on one seed can be luck of that
seed. So each resample also draws, for every configuration, as many seeds as
it has, with replacement, and averages the drawn replicates (`seed_weights`);
when both sides have the same seeds, the same seeds are drawn for both
(paired). The interval then holds the spread between seeds as well as the
spread between terms; with one seed per side it is the term bootstrap alone,
and it says nothing about training noise (one seed is an anecdote). Each row
says how many seeds and terms it rests on. The term-only interval with seeds
averaged per occurrence (what earlier versions reported) stays in the report
as a secondary view (`pooled_lo`, `pooled_hi`).

The paired test is a sign test over terms (`sign_test_p`): per term, the
configuration's mean minus the baseline's (over its occurrences and seeds); b
terms go one way, c the other (ties dropped); with no difference each goes
either way with probability 1/2, so p = min(1, 2 P(X <= min(b, c))) for
X ~ Binomial(b + c, 1/2). Terms, not occurrence x seed pairs, are the units
that can be taken as independent.

Run-level figures (eval.json: perplexity, false insertion) have one value per
run; their intervals are over seeds only (`seed_interval`: mean +- t s / sqrt(n),
paired by seed when both sides have the same seeds).

A worked example: terms A (two occurrences) and B (one); the baseline writes
only B, the method writes all three:

    >>> term = np.array([0, 0, 1])
    >>> base, method = np.array([0.0, 0.0, 1.0]), np.array([1.0, 1.0, 1.0])
    >>> r = paired_bootstrap(term, method, base, n_boot=2000, seed=0)
    >>> round(r.value, 4), r.lo, r.hi     # 3/3 - 1/3; resamples {A,A}: 1, {A,B}: 2/3, {B,B}: 0
    (0.6667, 0.0, 1.0)
    >>> round(paired_bootstrap(term, method, base, macro=True).value, 4)   # per term: (1 + 0) / 2
    0.5
    >>> sign_test_p(2, 0)                # two terms, both for the method: 2 * 1/4
    0.5
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence

import numpy as np

from rarelm.errors import RarelmError

# t quantiles (0.975) by degrees of freedom, for intervals over a handful of seeds
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
         10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042}


@dataclasses.dataclass(frozen=True)
class Interval:
    """A point estimate (on the data as observed) and its 95% percentile bootstrap interval."""

    value: float
    lo: float
    hi: float


def term_draws(n_terms: int, n_boot: int = 2000, seed: int = 0) -> np.ndarray:
    """How often each term is drawn in each resample: float [n_boot, n_terms], rows sum to n_terms.

    >>> term_draws(3, n_boot=4, seed=0).sum(axis=1).tolist()
    [3.0, 3.0, 3.0, 3.0]
    """
    if n_terms < 1 or n_boot < 1:
        raise RarelmError(f"bootstrap needs at least one term and one resample (got {n_terms}, {n_boot})")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, n_terms, size=(n_boot, n_terms))
    flat = (picks + (np.arange(n_boot) * n_terms)[:, None]).ravel()
    return np.bincount(flat, minlength=n_boot * n_terms).reshape(n_boot, n_terms).astype(np.float64)


def term_sums(term: np.ndarray, n_terms: int, values: np.ndarray,
              masks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-term sums of `values` and occurrence counts within each slice: two [n_terms, slices] arrays.

    `masks` is bool [slices, occurrences]: which occurrences each slice holds.
    """
    sums = np.empty((n_terms, len(masks)))
    counts = np.empty((n_terms, len(masks)))
    for j, mask in enumerate(masks):
        sums[:, j] = np.bincount(term[mask], weights=values[mask], minlength=n_terms)
        counts[:, j] = np.bincount(term[mask], minlength=n_terms)
    return sums, counts


def estimate(draws: np.ndarray, sums: np.ndarray, counts: np.ndarray,
             macro: bool = False) -> list[Interval]:
    """Mean of a per-occurrence quantity in each slice, with its term-bootstrap interval.

    `sums`, `counts` come from term_sums (for a paired difference, pass the
    difference of the two configurations' sums: it is linear). The mean is over
    occurrences (micro: sum / count over drawn terms) or, with `macro`, over terms
    (each term with occurrences in the slice counts once). A slice that a
    resample leaves empty drops out of that resample.
    """
    if macro:
        present = counts > 0
        num = np.divide(sums, counts, out=np.zeros_like(sums), where=present)
        den = present.astype(np.float64)
    else:
        num, den = sums, counts
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices
        point = num.sum(axis=0) / den.sum(axis=0)
        boot = (draws @ num) / (draws @ den)
        lo, hi = np.nanpercentile(boot, [2.5, 97.5], axis=0)
    return [Interval(float(p), float(a), float(b)) for p, a, b in zip(point, lo, hi, strict=True)]


def paired_bootstrap(term: Sequence, a: np.ndarray, b: np.ndarray | None = None, n_boot: int = 2000,
                     seed: int = 0, macro: bool = False) -> Interval:
    """Mean of a - b over occurrences (or terms, with `macro`) and its 95% interval, resampling terms.

    `term` labels each occurrence's term (any hashable values); `a`, `b` are
    per-occurrence values of the two configurations (b = None: the mean of a).
    Deterministic for a given seed.
    """
    _, index = np.unique(np.asarray(term), return_inverse=True)
    diff = np.asarray(a, dtype=np.float64) - (0.0 if b is None else np.asarray(b, dtype=np.float64))
    n_terms = int(index.max()) + 1
    sums, counts = term_sums(index, n_terms, diff, np.ones((1, len(diff)), dtype=bool))
    return estimate(term_draws(n_terms, n_boot, seed), sums, counts, macro)[0]


def seed_weights(n_seeds: int, n_boot: int = 2000, seed: int = 0,
                 draws: np.ndarray | None = None) -> np.ndarray:
    """Each replicate's weight in each resample: float [n_boot, n_seeds], rows sum to 1.

    Every resample draws n_seeds seeds with replacement; a replicate drawn twice weighs 2/n.
    `draws` (int [n_boot, n_seeds], seed indices) gives the draws instead, so that two
    configurations with the same seeds draw the same ones (see rarelm.report.compare).

    >>> (3 * seed_weights(3, draws=np.array([[0, 0, 2], [1, 2, 0]]))).tolist()
    [[2.0, 0.0, 1.0], [1.0, 1.0, 1.0]]
    """
    if draws is None:
        draws = np.random.default_rng([seed, 1]).integers(0, n_seeds, size=(n_boot, n_seeds))
    flat = (draws + (np.arange(len(draws)) * n_seeds)[:, None]).ravel()
    counts = np.bincount(flat, minlength=len(draws) * n_seeds).reshape(len(draws), n_seeds)
    return counts / n_seeds


def _per_term(sums: np.ndarray, counts: np.ndarray, macro: bool) -> tuple[np.ndarray, np.ndarray]:
    """(numerator, denominator) per term: sums and counts, or per-term means and presence (macro)."""
    if not macro:
        return sums, np.broadcast_to(counts, sums.shape[-2:])
    present = counts > 0
    means = np.divide(sums, counts, out=np.zeros_like(sums), where=np.broadcast_to(present, sums.shape))
    return means, present.astype(np.float64)


def hierarchical_estimate(draws: np.ndarray, counts: np.ndarray,
                          sides: list[tuple[float, np.ndarray, np.ndarray]],
                          macro: bool = False) -> list[Interval]:
    """Mean (or a paired difference) per slice, with the bootstrap over terms and seeds together.

    `draws`: term_draws [n_boot, n_terms]; `counts`: occurrences per term and slice
    [n_terms, slices]; `sides`: (sign, seed_weights [n_boot, replicates], per-replicate
    term sums [replicates, n_terms, slices]) for each configuration, +1 for the
    configuration and -1 for the baseline in a difference. In resample b a side's
    term sums are the seed-weighted mean of its replicates' sums, and the statistic
    is (sum over drawn terms of the signed sums) / (drawn occurrences), as in `estimate`.
    With one replicate per side this is `estimate` exactly.
    """
    num_point = num_boot = 0.0
    den = None
    for sign, weights, sums in sides:
        num, den = _per_term(sums, counts, macro)
        num_point = num_point + sign * num.mean(axis=0).sum(axis=0)
        by_replicate = np.einsum("bt,rts->brs", draws, num)  # each replicate's drawn-term sums
        num_boot = num_boot + sign * np.einsum("br,brs->bs", weights, by_replicate)
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices
        point = num_point / den.sum(axis=0)
        boot = num_boot / (draws @ den)
        lo, hi = np.nanpercentile(boot, [2.5, 97.5], axis=0)
    return [Interval(float(p), float(a), float(b)) for p, a, b in zip(point, lo, hi, strict=True)]


def sign_test_p(b: int, c: int) -> float:
    """Exact two-sided sign test: b units better, c worse, each 1/2 under no difference.

    >>> round(sign_test_p(9, 1), 4)      # 2 * (C(10,0) + C(10,1)) / 2^10
    0.0215
    >>> sign_test_p(0, 0)
    1.0
    """
    n, k = b + c, min(b, c)
    # exact integer arithmetic (what scipy.stats.binomtest gives, without its seconds of import)
    coefficient = tail = 1
    for i in range(k):
        coefficient = coefficient * (n - i) // (i + 1)
        tail += coefficient
    return min(1.0, 2 * tail / 2 ** n)


def term_signs(config_sums: np.ndarray, base_sums: np.ndarray, counts: np.ndarray) -> tuple[int, int]:
    """(terms where the configuration's mean is higher, terms where it is lower) within one slice.

    Sums and counts per term (seeds averaged); terms without occurrences in the slice and ties
    are left out.

    >>> term_signs(np.array([2.0, 0.0, 1.0, 0.0]), np.array([1.0, 1.0, 1.0, 0.0]), np.array([2, 1, 1, 0]))
    (1, 1)
    """
    present = counts > 0
    diff = (config_sums[present] - base_sums[present]) / counts[present]
    return int((diff > 1e-12).sum()), int((diff < -1e-12).sum())


def seed_interval(values: Sequence[float], base: Sequence[float] | None = None,
                  paired: bool = False) -> Interval | None:
    """Mean of per-run values (or of their difference to the baseline's) with a 95% t interval.

    Paired (the same seeds on both sides): the interval of the mean per-seed difference.
    Otherwise the two means' difference with sqrt(s1^2/n1 + s2^2/n2) and min(n1, n2) - 1
    degrees of freedom (conservative). None below two seeds on a side.

    >>> r = seed_interval([2.0, 4.0])          # mean 3, s = 1.414, t(1) = 12.706: 3 +- 12.706
    >>> r.value, round(r.lo, 3), round(r.hi, 3)
    (3.0, -9.706, 15.706)
    >>> seed_interval([3.0, 5.0], [1.0, 2.0], paired=True).value   # differences 2 and 3
    2.5
    """
    a = np.asarray(values, dtype=np.float64)
    if base is None or paired:
        x = a if base is None else a - np.asarray(base, dtype=np.float64)
        if len(x) < 2:
            return None
        half = _t975(len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
        return Interval(float(x.mean()), float(x.mean() - half), float(x.mean() + half))
    b = np.asarray(base, dtype=np.float64)
    if min(len(a), len(b)) < 2:
        return None
    diff = a.mean() - b.mean()
    half = _t975(min(len(a), len(b)) - 1) * math.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
    return Interval(float(diff), float(diff - half), float(diff + half))


def _t975(df: int) -> float:
    """The 0.975 quantile of Student's t (the table's next lower df, so never too narrow)."""
    return _T975[max(k for k in _T975 if k <= df)]

