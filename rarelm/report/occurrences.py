"""Alignment: every run's per-occurrence rows paired by occurrence, and the slices reported.

An occurrence is identified by (split, doc, char_start, term), so runs evaluated on the same data
hold exactly the same occurrences and every comparison is paired, occurrence by occurrence. A
configuration's value at an occurrence is the mean over its replicates (exact match 1 in two seeds
of three -> 2/3). How a row's field becomes a number:

    >>> field, convert = METRICS["choice_acc"]
    >>> field, convert(1), convert(3)
    ('choice_rank', 1.0, 0.0)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from rarelm.errors import RarelmError
from rarelm.evaluate.term_metrics import STRATA, stratum
from rarelm.rare_terms.term_search import band_label
from rarelm.report.configurations import Configuration
from rarelm.report.run_data import RunData, occurrence_key

LOW_COUNT = 15  # "rare" terms for the headline slice: seen at most this often in train

# metric -> (the row's field, how its value becomes a number); a null or absent field leaves the metric out
METRICS: dict[str, tuple[str, Any]] = {
    "exact_match": ("exact_match", lambda v: float(bool(v))),
    "exact_match_ci": ("exact_match_ci", lambda v: float(bool(v))),  # compared case folded
    # the rest of the term written after the prompt + its first token (rarelm.evaluate.term_generation)
    "completion_match": ("completion_match", lambda v: float(bool(v))),
    # the share of the term's characters written right before the first wrong one (graded exact match)
    "prefix_share": ("prefix_share", float),
    "first_token_acc": ("first_token_hit", lambda v: float(bool(v))),
    "nll": ("nll", float),
    "choice_acc": ("choice_rank", lambda v: float(int(v) == 1)),
    "nll_per_char": ("nll_per_char", float),  # term NLL per character of its covering tokens' text
    "nll_per_term": ("nll_sum", float),  # summed over the term's covering tokens
    "token_acc": ("token_acc", float),  # share of the term's tokens predicted top-1 (teacher forced)
    "first_token_rr": ("first_token_rr", float),  # reciprocal rank of the first term token
}
# term perplexity: exp of `nll` (per term token, in the baseline's tokens: _in_baseline_tokens), not a
# field of its own: compare derives its rows
DERIVED = {"term_ppl": "nll"}
LOWER_IS_BETTER = {"nll", "nll_per_char", "nll_per_term", "term_ppl"}
STRATUM_SLICES = tuple(f"seen {label}" for label, *_ in STRATA)  # train-count strata, unseen included
MAIN_SLICES = ("all", "first mention", "repeat mention", f"train_count<={LOW_COUNT}", *STRATUM_SLICES)


@dataclasses.dataclass
class Occurrences:
    """What every run shares, in one order: each occurrence's term, train count, band, mention."""

    keys: list[tuple]
    term: np.ndarray  # index into terms
    terms: list[str]
    train_count: np.ndarray
    band: np.ndarray  # band label per occurrence
    mention: np.ndarray  # "first" | "repeat" | "" per occurrence


def same_occurrences(a: RunData, b: RunData) -> bool:
    """Whether two runs were evaluated on the same term occurrences (so they can be paired)."""
    return sorted(map(occurrence_key, a.rows)) == sorted(map(occurrence_key, b.rows))


def align(configs: list[Configuration], metrics: Sequence[str]) -> tuple[Occurrences, list[str]]:
    """Pair every run's rows by occurrence; fill each configuration's values.

    Returns the shared occurrences and the metrics that every run holds
    (a metric some run lacks is left out). Different occurrence sets are an error.
    """
    runs = [run for c in configs for run in c.runs]
    first = runs[0]
    by_key: dict[tuple, dict] = {}
    for row in first.rows:
        key = occurrence_key(row)
        if key in by_key:
            raise RarelmError(f"{first.name}: occurrence {key} appears twice in its results")
        by_key[key] = row
    keys = sorted(by_key)
    index = {key: i for i, key in enumerate(keys)}
    available = [m for m in metrics
                 if all(all(r.get(METRICS[m][0]) is not None for r in run.rows) for run in runs)]
    n = len(keys)
    base_tokens = [by_key[key].get("n_tokens") for key in keys]
    for config in configs:
        for m in available:
            config.values[m] = np.empty((len(config.runs), n))
        for i, run in enumerate(config.runs):
            order = np.full(n, -1)
            for j, row in enumerate(run.rows):
                at = index.get(occurrence_key(row), -1)
                if at < 0 or order[at] >= 0:
                    order = None
                    break
                order[at] = j
            if order is None or (order < 0).any() or len(run.rows) != n:
                raise RarelmError(f"runs {first.name} and {run.name} were evaluated on different "
                                  "occurrences; compare runs of the same data")
            for m in available:
                field, convert = METRICS[m]
                config.values[m][i] = [convert(run.rows[j][field]) for j in order]
            if "nll" in available:
                _in_baseline_tokens(config.values["nll"][i], [run.rows[j] for j in order], base_tokens)
    terms = sorted({k[3] for k in keys})
    term_id = {t: i for i, t in enumerate(terms)}
    rows = [by_key[key] for key in keys]
    occ = Occurrences(
        keys=keys,
        term=np.array([term_id[k[3]] for k in keys], dtype=np.int64),
        terms=terms,
        train_count=np.array([int(r["train_count"]) for r in rows], dtype=np.int64),
        band=np.array([_band(r) for r in rows], dtype=object),
        mention=np.array([str(r.get("mention") or "") for r in rows], dtype=object))
    return occ, available


def _in_baseline_tokens(nll: np.ndarray, rows: list[dict], base_tokens: list) -> None:
    """A run's NLL per term token, in place, over the baseline's tokens of each occurrence where
    its own tokenizer cut the term into a different number (terms as tokens: one token where the
    baseline has several), so that term perplexity compares across tokenizers: the NLL of the same
    characters, summed, over the same count. Where the counts agree it is left as it is.

    >>> nll = np.array([1.5, 0.2])   # the term of occurrence 0 is one token here, three in the baseline
    >>> _in_baseline_tokens(nll, [{"n_tokens": 1, "nll_sum": 1.5}, {"n_tokens": 2, "nll_sum": 0.4}], [3, 2])
    >>> nll.tolist()
    [0.5, 0.2]
    """
    for i, row in enumerate(rows):
        n, base = row.get("n_tokens"), base_tokens[i]
        if n and base and n != base and row.get("nll_sum") is not None:
            nll[i] = float(row["nll_sum"]) / base


def _band(row: dict) -> str:
    """The row's train-count band ("4-7"), from its train count."""
    return band_label(int(row["train_count"]))


def slices(occ: Occurrences) -> list[tuple[str, np.ndarray]]:
    """(name, mask) of every slice reported: all, per mention type, train_count <= 15, the strata
    (seen 0-1, 2-15, 16+ times in train), per band."""
    out = [("all", np.ones(len(occ.keys), dtype=bool))]
    for kind in ("first", "repeat"):
        mask = occ.mention == kind
        if mask.any():
            out.append((f"{kind} mention", mask))
    out.append((f"train_count<={LOW_COUNT}", occ.train_count <= LOW_COUNT))
    strata = np.array([stratum(int(c)) for c in occ.train_count], dtype=object)
    out.extend((f"seen {label}", strata == label) for label, *_ in STRATA if (strata == label).any())
    bands = sorted(set(occ.band), key=lambda b: occ.train_count[occ.band == b].min())
    out.extend((f"band {b}", occ.band == b) for b in bands)
    return out
