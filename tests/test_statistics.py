"""statistics: the term x seed bootstrap, the sign test and the seed intervals, checked by hand and by
simulation."""

from __future__ import annotations

import time

import numpy as np
import pytest

from rarelm.report import statistics as stats
from tests.helpers import GEN


def test_identical_configurations_differ_by_zero():
    rows = GEN["occurrence_rows"](1, 0.0)
    term, em = [r["term"] for r in rows], np.array([float(r["exact_match"]) for r in rows])
    for macro in (False, True):
        r = stats.paired_bootstrap(term, em, em.copy(), n_boot=500, seed=3, macro=macro)
        assert (r.value, r.lo, r.hi) == (0.0, 0.0, 0.0)


def test_a_constructed_difference_is_recovered():
    # 20 terms with 1..4 occurrences; the method writes every occurrence of terms 0-9, the baseline none
    term = np.repeat(np.arange(20), [1 + t % 4 for t in range(20)])
    base = np.zeros(len(term))
    method = (term < 10).astype(float)
    exact = 23 / 50  # terms 0-9 hold 1+2+3+4+1+2+3+4+1+2 = 23 of the 50 occurrences
    r = stats.paired_bootstrap(term, method, base, n_boot=2000, seed=0)
    assert r.value == pytest.approx(exact)
    assert r.lo < exact < r.hi and 0.2 < r.lo and r.hi < 0.75
    per_term = stats.paired_bootstrap(term, method, base, n_boot=2000, seed=0, macro=True)
    assert per_term.value == pytest.approx(0.5) and per_term.lo < 0.5 < per_term.hi
    # the mean of one side alone (b = None) is the same number
    assert stats.paired_bootstrap(term, method, n_boot=10).value == pytest.approx(exact)


def test_terms_are_resampled_not_occurrences():
    # 20 terms x 50 perfectly correlated occurrences; the method wins on 10 terms, ties on 10.
    # Resampling occurrences would see 1000 independent outcomes (interval ~ +-0.03); terms: ~ +-0.22.
    term = np.repeat(np.arange(20), 50)
    method, base = (term < 10).astype(float), np.zeros(1000)
    by_term = stats.paired_bootstrap(term, method, base, n_boot=2000, seed=0)
    by_occurrence = stats.paired_bootstrap(np.arange(1000), method, base, n_boot=2000, seed=0)
    term_width, occurrence_width = by_term.hi - by_term.lo, by_occurrence.hi - by_occurrence.lo
    expected = 2 * 1.96 * 0.5 / np.sqrt(20)  # normal approximation, 20 independent terms
    assert by_term.value == by_occurrence.value == 0.5
    assert 0.8 * expected < term_width < 1.2 * expected
    assert term_width > 5 * occurrence_width


def test_the_bootstrap_is_deterministic_given_its_seed_and_fast():
    rng = np.random.default_rng(0)
    term = rng.integers(0, 300, size=2000)
    a, b = rng.random(2000) < 0.6, rng.random(2000) < 0.5
    first = stats.paired_bootstrap(term, a, b, n_boot=2000, seed=7)
    assert stats.paired_bootstrap(term, a, b, n_boot=2000, seed=7) == first
    assert stats.paired_bootstrap(term, a, b, n_boot=2000, seed=8) != first
    started = time.perf_counter()
    draws = stats.term_draws(300, 2000, seed=0)
    sums, counts = stats.term_sums(term, 300, a - b.astype(float), np.ones((1, 2000), dtype=bool))
    stats.estimate(draws, sums, counts)
    assert time.perf_counter() - started < 1.0
    assert draws.shape == (2000, 300) and (draws.sum(axis=1) == 300).all()


def _simulated_seeds(rng, n_terms: int = 40, n_seeds: int = 6, seed_sd: float = 0.3):
    """Per-replicate term sums of two configurations with no true difference: a shared term effect
    (cancels in the pair), a seed effect of known sd per configuration and seed, small occurrence noise."""
    term = np.repeat(np.arange(n_terms), 2)
    term_effect = rng.normal(0, 1, n_terms)[term]
    sides = []
    for _ in range(2):
        values = [term_effect + rng.normal(0, seed_sd) + rng.normal(0, 0.05, len(term))
                  for _ in range(n_seeds)]
        sides.append(np.stack([stats.term_sums(term, n_terms, v, np.ones((1, len(term)), bool))[0]
                               for v in values]))
    counts = np.full((n_terms, 1), 2.0)
    return sides, counts


def test_hierarchical_bootstrap_covers_the_seed_spread_the_term_bootstrap_misses():
    """100 simulated comparisons, true difference 0, seed sd 0.3 on 6 seeds a side: the term x seed
    interval holds 0 in most; the term-only interval (seeds averaged per occurrence) almost never."""
    rng = np.random.default_rng(0)
    held = {"terms x seeds": 0, "terms only": 0}
    widths = []
    for k in range(100):
        (config, base), counts = _simulated_seeds(rng)
        draws = stats.term_draws(40, 400, seed=k)
        weights = stats.seed_weights(6, 400, seed=k)  # the same seeds drawn for both sides (paired)
        both = stats.hierarchical_estimate(draws, counts, [(1.0, weights, config), (-1.0, weights, base)])[0]
        pooled = stats.estimate(draws, config.mean(0) - base.mean(0), counts)[0]
        assert both.value == pytest.approx(pooled.value)  # the same point estimate
        held["terms x seeds"] += both.lo <= 0 <= both.hi
        held["terms only"] += pooled.lo <= 0 <= pooled.hi
        widths.append((both.hi - both.lo, pooled.hi - pooled.lo))
    assert held["terms x seeds"] >= 80 and held["terms only"] <= 10, held
    width, term_width = np.mean(widths, axis=0)
    # the difference of two means of 6 seeds with sd 0.3: sd 0.173, a 95% interval ~0.68 wide
    assert 0.45 < width < 0.8 and term_width < 0.05


def test_one_seed_a_side_is_the_term_bootstrap():
    rng = np.random.default_rng(1)
    (config, base), counts = _simulated_seeds(rng, n_seeds=1)
    draws = stats.term_draws(40, 300, seed=2)
    ones = np.ones((300, 1))
    both = stats.hierarchical_estimate(draws, counts, [(1.0, ones, config), (-1.0, ones, base)],
                                       macro=True)[0]
    terms_only = stats.estimate(draws, config[0] - base[0], counts, macro=True)[0]
    assert (both.value, both.lo, both.hi) == pytest.approx((terms_only.value, terms_only.lo, terms_only.hi))


def test_sign_test_by_hand():
    assert stats.sign_test_p(9, 1) == pytest.approx(2 * (1 + 10) / 2 ** 10)  # 0.021484375
    assert stats.sign_test_p(1, 9) == pytest.approx(0.021484375)
    assert stats.sign_test_p(5, 5) == 1.0 and stats.sign_test_p(0, 0) == 1.0
    assert stats.sign_test_p(3, 0) == pytest.approx(2 / 8)
    assert stats.sign_test_p(0, 60) == 2 / 2 ** 60  # big n: exact ints
    assert stats.sign_test_p(5000, 5001) == 1.0
    scipy_stats = pytest.importorskip("scipy.stats")  # the same numbers as scipy's exact binomial test
    for b, c in ((9, 1), (30, 12), (250, 301), (0, 7)):
        exact = scipy_stats.binomtest(min(b, c), b + c, 0.5).pvalue
        assert stats.sign_test_p(b, c) == pytest.approx(exact, rel=1e-9)


def test_the_sign_test_counts_terms_not_occurrences_or_seeds():
    # term 0: 3 occurrences, the configuration better at all; term 1 worse; term 2 tied; term 3 absent
    config, base = np.array([3.0, 0.0, 1.0, 0.0]), np.array([0.0, 1.0, 1.0, 0.0])
    assert stats.term_signs(config, base, np.array([3, 1, 1, 0])) == (1, 1)


def test_seed_intervals_of_run_level_figures():
    r = stats.seed_interval([1.0, 2.0, 3.0])  # mean 2, s 1, t(2) 4.303
    assert (r.value, r.lo, r.hi) == pytest.approx((2.0, 2 - 4.303 / 3 ** 0.5, 2 + 4.303 / 3 ** 0.5))
    paired = stats.seed_interval([2.0, 3.0, 5.0], [1.0, 2.0, 3.0], paired=True)  # differences 1, 1, 2
    assert paired.value == pytest.approx(4 / 3) and paired.hi - paired.value == pytest.approx(
        4.303 * np.std([1, 1, 2], ddof=1) / 3 ** 0.5)
    welch = stats.seed_interval([2.0, 4.0, 6.0], [1.0, 2.0])  # df min(3, 2) - 1 = 1
    assert welch.value == pytest.approx(2.5)
    assert welch.hi - welch.value == pytest.approx(12.706 * (4 / 3 + 0.5 / 2) ** 0.5)
    assert stats.seed_interval([1.0]) is None and stats.seed_interval([1.0, 2.0], [1.0]) is None
