"""Compare evaluated runs: paired differences with term x seed bootstrap intervals (`rarelm compare`).

Runs whose params differ only by the top-level `seed` are replicates of one
configuration: an occurrence's value for the configuration is the mean over its
replicates (exact match 1 in two seeds of three -> 2/3). Two runs with the same
params and the same seed are not replicates (they differ in code: other commits)
and stay apart. Every configuration is compared with the baseline configuration
(`--baseline`, one run or several seeds). The statistics, why terms and seeds are
resampled together, and the sign test: rarelm/report/statistics.py. Run-level
figures (eval.json: perplexity, false insertion) have one value per run; their
intervals are over seeds only:

    >>> _interval("diff", seed_interval([3.0, 5.0], [1.0, 2.0], paired=True))["diff"]
    2.5
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from rarelm.errors import RarelmError
from rarelm.report.configurations import Configuration, group_runs
from rarelm.report.occurrences import DERIVED, LOWER_IS_BETTER, METRICS, Occurrences, align, slices
from rarelm.report.run_data import RunData
from rarelm.report.statistics import (
    Interval,
    estimate,
    hierarchical_estimate,
    seed_interval,
    seed_weights,
    sign_test_p,
    term_draws,
    term_signs,
    term_sums,
)

# eval.json figures with one value per run, shown with intervals over seeds
RUN_METRICS = ("ppl", "ppl_frequent", "ppl_medium", "ppl_rare", "ppl_term", "ppl_general",
               "ppl_general_model", "ppl_general_outside", "false_insertion_rate",
               "false_insertion_rate_chars", "false_insertion_gen_per_1k", "false_insertion_start_mass",
               "term_repeat_share_text")


def compare(baseline: list[RunData], runs: list[RunData], metrics: Sequence[str] = tuple(METRICS),
            n_boot: int = 2000, seed: int = 0) -> dict:
    """Every number of the report, as a JSON-able dict (views: rarelm/report/tables.py, page.py)."""
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise RarelmError(f"--metric {unknown[0]} is not allowed (must be one of {', '.join(METRICS)})")
    if n_boot < 1:
        raise RarelmError(f"--bootstrap = {n_boot} is not allowed (must be >= 1)")
    configs = group_runs(baseline, runs)
    occ, available = align(configs, metrics)
    if not available:
        raise RarelmError(f"no run holds all of {', '.join(metrics)} for every occurrence")
    named = slices(occ)
    masks = np.array([mask for _, mask in named])
    n_terms = len(occ.terms)
    draws = term_draws(n_terms, n_boot, seed)
    _, counts = term_sums(occ.term, n_terms, np.zeros(len(occ.keys)), masks)
    weights = _all_seed_weights(configs, n_boot, seed)
    rows = [row for metric in available
            for row in _metric_rows(metric, configs, occ, named, masks, draws, counts, weights)]
    derived = [name for name, source in DERIVED.items() if source in available]
    rows += [exp_row(r, name) for name in derived for r in rows if r["metric"] == DERIVED[name]]
    available = [*available, *derived]
    base = configs[0]
    return {
        "configurations": [{"label": c.label, "baseline": c is base, "seeds": c.seeds,
                            "runs": [{"ref": r.ref, "name": r.name, "source": r.source, "id": r.ident,
                                      "seed": r.seed, "experiment": r.experiment} for r in c.runs],
                            "summary": _mean_summary(c.runs)} for c in configs],
        "bootstrap": {"resamples": n_boot, "seed": seed, "unit": "term x seed", "interval": "95% percentile",
                      "test": "sign test over terms"},
        "occurrences": len(occ.keys), "terms": n_terms,
        "splits": sorted({k[0] for k in occ.keys}),
        "metrics": available,
        "lower_is_better": [m for m in available if m in LOWER_IS_BETTER],
        "left_out": [m for m in metrics if m not in available],
        "curve_x": {name: float(occ.train_count[mask].mean()) for name, mask in named
                    if name.startswith("band ")},
        "rows": rows,
        "run_rows": run_rows(configs),
    }


def report_row(report: dict, config: str, slice_: str, metric: str = "exact_match") -> dict:
    """A configuration's row of a `compare` report, over occurrences, in one slice and metric
    ({} if the report has none)."""
    return next((r for r in report["rows"] if r["configuration"] == config and r["slice"] == slice_
                 and r["aggregate"] == "occurrences" and r["metric"] == metric), {})


def _metric_rows(metric: str, configs: list[Configuration], occ: Occurrences,
                 named: list[tuple[str, np.ndarray]], masks: np.ndarray, draws: np.ndarray,
                 counts: np.ndarray, weights: dict[int, np.ndarray]) -> list[dict]:
    """One metric's rows: per configuration, aggregate (over occurrences, over terms) and slice, each
    with its value and, against the baseline, the difference, the pooled interval and the sign test."""
    n_terms = len(occ.terms)
    per_seed = {id(c): np.stack([term_sums(occ.term, n_terms, v, masks)[0] for v in c.values[metric]])
                for c in configs}
    base = configs[0]
    base_sums = per_seed[id(base)].mean(axis=0)
    rows = []
    for config in configs:
        mine = (1.0, weights[id(config)], per_seed[id(config)])
        theirs = (-1.0, weights[id(base)], per_seed[id(base)])
        sums = per_seed[id(config)].mean(axis=0)  # seeds averaged per occurrence: the pooled view
        for aggregate, macro in (("occurrences", False), ("terms", True)):
            values = hierarchical_estimate(draws, counts, [mine], macro)
            diffs = pooled = None
            if config is not base:
                diffs = hierarchical_estimate(draws, counts, [mine, theirs], macro)
                pooled = estimate(draws, sums - base_sums, counts, macro)
            for j, (name, _) in enumerate(named):
                row = {"configuration": config.label, "seeds": len(config.runs),
                       "baseline_seeds": len(base.runs), "metric": metric, "slice": name,
                       "aggregate": aggregate, "occurrences": int(counts[:, j].sum()),
                       "terms": int((counts[:, j] > 0).sum()), **_interval("value", values[j])}
                if diffs is not None:
                    row.update(_interval("diff", diffs[j]))
                    row.update({"pooled_lo": _num(pooled[j].lo), "pooled_hi": _num(pooled[j].hi)})
                    if aggregate == "occurrences":
                        b, c = term_signs(sums[:, j], base_sums[:, j], counts[:, j])
                        row.update({"p": sign_test_p(b, c), "term_signs": [b, c]})
                rows.append(row)
    return rows


def exp_row(row: dict, metric: str) -> dict:
    """A row of NLL per term token as term perplexity: value and interval exp(.), the difference as
    the relative change exp(diff) - 1 with its interval (percentiles commute with a monotone map, so the
    interval is the bootstrap's own); p and the term signs are the NLL's. `diff_is_relative` marks it.

    >>> r = exp_row({"metric": "nll", "value": 1.0, "value_lo": 0.5, "value_hi": 2.0, "diff": -0.5,
    ...              "diff_lo": -1.0, "diff_hi": 0.0}, "term_ppl")
    >>> r["metric"], round(r["value"], 4), round(r["diff"], 4), round(r["diff_lo"], 4), r["diff_hi"]
    ('term_ppl', 2.7183, -0.3935, -0.6321, 0.0)
    """
    out = {**row, "metric": metric, "diff_is_relative": True}
    for key in ("value", "value_lo", "value_hi"):
        out[key] = _num(math.exp(row[key])) if row.get(key) is not None else None
    for key in ("diff", "diff_lo", "diff_hi", "pooled_lo", "pooled_hi"):
        if key in row:
            out[key] = _num(math.expm1(row[key])) if row[key] is not None else None
    return out


def _all_seed_weights(configs: list[Configuration], n_boot: int, seed: int) -> dict[int, np.ndarray]:
    """seed_weights per configuration (by id): the baseline's seed draws, re-used (paired) by every
    configuration with the same distinct seeds; the others draw their own."""
    base = configs[0]
    rng = np.random.default_rng([seed, 1])
    base_draws = rng.integers(0, len(base.runs), size=(n_boot, len(base.runs)))
    out = {}
    for config in configs:
        if _same_seeds(config, base):
            draws = np.array([config.seeds.index(s) for s in base.seeds])[base_draws]
        else:
            draws = rng.integers(0, len(config.runs), size=(n_boot, len(config.runs)))
        out[id(config)] = seed_weights(len(config.runs), draws=draws)
    return out


def _same_seeds(a: Configuration, b: Configuration) -> bool:
    """Both sides hold the same distinct seeds, so replicates pair by seed."""
    return len(set(a.seeds)) == len(a.seeds) == len(b.seeds) and set(a.seeds) == set(b.seeds)


def run_rows(configs: list[Configuration]) -> list[dict]:
    """RUN_METRICS of eval.json per configuration (a perplexity in the baseline's tokens): mean over
    seeds, its interval, the difference to the baseline (paired by seed when the seeds are the same)
    and the relative change."""
    base = configs[0]
    rows = []
    for key in RUN_METRICS:
        base_values = _run_values(base, key, base)
        if base_values is None:
            continue
        for config in configs:
            values = _run_values(config, key, base)
            if values is None:
                continue
            row = {"configuration": config.label, "seeds": len(values), "metric": key,
                   "value": float(np.mean(values))}
            row.update(_interval("value", seed_interval(values)) if len(values) > 1 else
                       {"value_lo": None, "value_hi": None})
            if config is not base:
                paired = _same_seeds(config, base)
                other = [base_values[base.seeds.index(s)] for s in config.seeds] if paired else base_values
                diff = seed_interval(values, other, paired=paired)
                row["diff"] = float(np.mean(values) - np.mean(base_values))
                row.update({"diff_lo": None, "diff_hi": None} if diff is None else
                           {"diff_lo": _num(diff.lo), "diff_hi": _num(diff.hi)})
                mean_base = float(np.mean(base_values))
                row["relative"] = None if mean_base == 0 else row["value"] / mean_base - 1
            rows.append(row)
    return rows


def _run_values(config: Configuration, key: str, base: Configuration) -> list[float] | None:
    """The key's value in every replicate's eval.json, or None if some replicate lacks it; a
    perplexity in the baseline's tokens (in_baseline_tokens: another tokenizer cuts the same text
    into another number of tokens)."""
    values = [r.summary.get(key) for r in config.runs]
    if any(not isinstance(v, (int, float)) or isinstance(v, bool) for v in values):
        return None
    return [float(in_baseline_tokens(r.summary, base.runs[0].summary, key)) for r in config.runs]


# a perplexity per token and the count of tokens it is over (eval.json)
PER_TOKEN = {"ppl": "n_eval_tokens", "ppl_general": "n_general_tokens",
             "ppl_general_model": "n_general_tokens", "ppl_general_outside": "n_general_outside_tokens"}


def in_baseline_tokens(summary: dict, base: dict, key: str) -> float:
    """`summary[key]`, a perplexity over n tokens, as the perplexity of the same total NLL over the
    baseline's n_base tokens of the same text: exp(ln(ppl) x n / n_base). Unchanged where the counts
    agree or are unknown, and for a figure that is no perplexity per token.

    >>> round(in_baseline_tokens({"ppl": 10.3, "n_eval_tokens": 99}, {"n_eval_tokens": 100}, "ppl"), 4)
    10.0626
    """
    value, count = summary[key], PER_TOKEN.get(key)
    n, n_base = (summary.get(count), base.get(count)) if count else (None, None)
    if not n or not n_base or n == n_base or value <= 0:
        return value
    return math.exp(math.log(value) * n / n_base)



def _interval(prefix: str, r: Interval) -> dict:
    return {prefix: _num(r.value), f"{prefix}_lo": _num(r.lo), f"{prefix}_hi": _num(r.hi)}


def _num(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _mean_summary(runs: list[RunData]) -> dict[str, float]:
    """eval.json's numbers averaged over replicates (a key some replicate lacks is left out)."""
    keys = set.intersection(*(set(r.summary) for r in runs)) if runs else set()
    out = {}
    for key in sorted(keys):
        values = [r.summary[key] for r in runs]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            out[key] = float(np.mean(values))
    return out
