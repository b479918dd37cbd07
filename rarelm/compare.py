"""Compare evaluated runs: paired differences with term x seed bootstrap intervals (`rarelm compare`).

The evaluate stage writes one row per evaluated term occurrence
(metrics/eval_occurrences.jsonl; `eval/eval_occurrences.jsonl` in the run's MLflow
artifacts): the term, its train count and band, first or repeat mention, and
whether the model wrote it (`exact_match`, `first_token_hit`), its NLL and the
rank of the true term among all candidates (`choice_rank`; 1 = closed-set choice
right). An occurrence is identified by (split, doc, char_start, term), so two
runs evaluated on the same data hold exactly the same occurrences: every
comparison below is paired, occurrence by occurrence.

Runs whose params differ only by the top-level `seed` are replicates of one
configuration: an occurrence's value for the configuration is the mean over its
replicates (exact match 1 in two seeds of three -> 2/3). Two runs with the same
params and the same seed are not replicates (they differ in code: other commits)
and stay apart. Every configuration is compared with the baseline configuration
(`--baseline`, one run or several seeds).

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
import html
import io
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rarelm.errors import RarelmError

OCCURRENCES = "metrics/eval_occurrences.jsonl"
SUMMARY = "metrics/eval.json"
PARAMS = "params.yaml"
MLFLOW_OCCURRENCES = "eval/eval_occurrences.jsonl"
MLFLOW_SUMMARY = "eval/eval.json"
WORKSPACE = "workspace"
REPLICATE_KEYS = ("seed",)  # params that vary between replicates of one configuration
LOW_COUNT = 15  # "rare" terms for the headline slice: seen at most this often in train

# metric -> (the row's field, how its value becomes a number); a null or absent field leaves the metric out
METRICS: dict[str, tuple[str, Any]] = {
    "exact_match": ("exact_match", lambda v: float(bool(v))),
    "first_token_acc": ("first_token_hit", lambda v: float(bool(v))),
    "nll": ("nll", float),
    "choice_acc": ("choice_rank", lambda v: float(int(v) == 1)),
    "nll_per_char": ("nll_per_char", float),  # term NLL per character of its covering tokens' text
    "nll_per_term": ("nll_sum", float),  # summed over the term's covering tokens
    "token_acc": ("token_acc", float),  # share of the term's tokens predicted top-1 (teacher forced)
    "first_token_rr": ("first_token_rr", float),  # reciprocal rank of the first term token
}
LOWER_IS_BETTER = {"nll", "nll_per_char", "nll_per_term"}
PPL_KEYS = ("ppl_frequent", "ppl_medium", "ppl_rare", "ppl_term")
# eval.json figures with one value per run, shown with intervals over seeds
RUN_METRICS = ("ppl", "ppl_frequent", "ppl_medium", "ppl_rare", "ppl_term", "false_insertion_rate",
               "false_insertion_gen_per_1k", "false_insertion_start_mass")
# t quantiles (0.975) by degrees of freedom, for intervals over a handful of seeds
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
         10: 2.228, 15: 2.131, 20: 2.086, 30: 2.042}
MAIN_SLICES = ("all", "first mention", "repeat mention", f"train_count<={LOW_COUNT}")
_KEY_FIELDS = ("split", "doc", "char_start", "term")


# ---------------------------------------------------------------- statistics


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
    configurations with the same seeds draw the same ones (see `compare`).

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


# ---------------------------------------------------------------- loading runs


@dataclasses.dataclass
class RunData:
    """One evaluated run: where it came from, its params (flat, canonical strings) and its rows."""

    ref: str  # what the user gave: an experiment name, a revision, an MLflow run id, "workspace"
    name: str  # how reports show it
    source: str  # "workspace" | "git" | "mlflow"
    ident: str  # commit, MLflow run id, or "workspace"
    params: dict[str, str]
    rows: list[dict]
    summary: dict  # eval.json (may lack keys in older runs)
    experiment: str = ""  # the DVC experiment name, when it is one

    @property
    def seed(self) -> str:
        return self.params.get("seed", "?")


def _git(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=60)
    except OSError as exc:
        raise RarelmError(f"cannot run git: {exc}") from None


def _head(repo: Path) -> str:
    out = _git(["rev-parse", "--verify", "-q", "HEAD"], repo)
    return out.stdout.decode().strip() if out.returncode == 0 else ""


def experiment_refs(repo: Path) -> list[tuple[str, str, str]]:
    """Every DVC experiment as (name, baseline commit, experiment commit).

    DVC 3 keeps a finished experiment as the git ref refs/exps/<baseline[:2]>/<baseline[2:]>/<name>;
    its own bookkeeping lives under refs/exps/{apply,celery,exec,temp}/ and refs/exps/stash.
    """
    out = _git(["for-each-ref", "--format=%(refname) %(objectname)", "refs/exps/"], repo)
    found = []
    for line in out.stdout.decode().splitlines():
        ref, _, commit = line.partition(" ")
        parts = ref.split("/")
        if len(parts) == 5 and re.fullmatch(r"[0-9a-f]{2}", parts[2]) and re.fullmatch(r"[0-9a-f]{38}",
                                                                                       parts[3]):
            found.append((parts[4], parts[2] + parts[3], commit))
    return found


def experiments_of_head(repo: Path) -> list[str]:
    """Names of the DVC experiments whose baseline is HEAD (what `dvc exp show` lists under it)."""
    head = _head(repo)
    return sorted(name for name, baseline, _ in experiment_refs(repo) if baseline == head)


def resolve_experiment(name: str, repo: Path) -> str | None:
    """The commit of DVC experiment `name`, as `dvc exp` resolves it (one of HEAD's if several)."""
    matches = [(baseline, commit) for exp, baseline, commit in experiment_refs(repo) if exp == name]
    if len(matches) > 1:
        head = _head(repo)
        matches = [m for m in matches if m[0] == head]
        if len(matches) != 1:
            raise RarelmError(f"{name}: several DVC experiments have this name (for different baseline "
                              "commits); give the experiment's commit instead")
    return matches[0][1] if matches else None


def load_run(ref: str, repo: str | Path = ".", split: str = "") -> RunData:
    """Load a run by DVC experiment name, git revision, MLflow run id or `workspace`.

    Raises a one-line RarelmError if the run is not found or holds no per-occurrence results.
    """
    repo = Path(repo)
    if ref == WORKSPACE:
        run = _load_files(ref, WORKSPACE, WORKSPACE, WORKSPACE, lambda rel: _read_file(repo / rel))
    elif re.fullmatch(r"[0-9a-f]{32}", ref):
        run = _load_mlflow(ref)
    else:
        commit = resolve_experiment(ref, repo)
        experiment = ref if commit else ""
        if commit is None:
            out = _git(["rev-parse", "--verify", "-q", f"{ref}^{{commit}}"], repo)
            if out.returncode != 0:
                raise RarelmError(f"{ref}: not a DVC experiment, git revision, MLflow run id "
                                  f"(32 hex digits) or '{WORKSPACE}'")
            commit = out.stdout.decode().strip()
        run = _load_files(ref, ref, "git", commit, lambda rel: _read_git(repo, commit, rel))
        run.experiment = experiment
    if split:
        run.rows = [r for r in run.rows if r["split"] == split]
        if not run.rows:
            raise RarelmError(f"{run.name}: no evaluated occurrences in split {split!r}")
        run.summary = split_summary(run.summary, run.params, split)
    return run


def split_summary(summary: dict, params: dict[str, str], split: str) -> dict:
    """eval.json's figures for one split: the top level is eval.splits' first, the others nest.

    >>> split_summary({"ppl": 2.0, "val": {"ppl": 3.0}}, {"eval.splits": '["test", "val"]'}, "val")
    {'ppl': 3.0}
    >>> split_summary({"ppl": 2.0}, {}, "val")      # a split the run did not score
    {}
    """
    if isinstance(summary.get(split), dict):
        return summary[split]
    try:
        first = json.loads(params.get("eval.splits", '["test"]'))[0]
    except (ValueError, IndexError, TypeError):
        first = "test"
    return {k: v for k, v in summary.items() if not isinstance(v, dict)} if first == split else {}


def _read_file(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise RarelmError(f"{path}: cannot read ({exc})") from None


def _read_git(repo: Path, commit: str, rel: str) -> str | None:
    out = _git(["show", f"{commit}:./{rel}"], repo)
    if out.returncode != 0:
        return None
    try:
        return out.stdout.decode("utf-8")
    except UnicodeDecodeError:
        raise RarelmError(f"{rel} at {commit[:10]} is not UTF-8") from None


def _load_files(ref: str, name: str, source: str, ident: str, read) -> RunData:
    where = "in the workspace" if source == WORKSPACE else f"at {ref}"
    text = read(OCCURRENCES)
    if text is None:
        raise RarelmError(f"{ref}: no {OCCURRENCES} {where} (evaluated before per-occurrence results "
                          "were written? re-run evaluate)")
    rows = parse_occurrences(text, f"{OCCURRENCES} {where}")
    params_text = read(PARAMS)
    if params_text is None:
        raise RarelmError(f"{ref}: no {PARAMS} {where}")
    summary_text = read(SUMMARY)
    summary = _json(summary_text, f"{SUMMARY} {where}") if summary_text else {}
    return RunData(ref, name, source, ident, _yaml_params(params_text, f"{PARAMS} {where}"), rows, summary)


def _json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise RarelmError(f"{where}: not valid JSON ({exc})") from None


def parse_occurrences(text: str, where: str) -> list[dict]:
    """The rows of an eval_occurrences.jsonl, checked for the key fields and train_count."""
    rows = []
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise RarelmError(f"{where}: line {line_no} is not valid JSON ({exc})") from None
        missing = [k for k in (*_KEY_FIELDS, "train_count", "exact_match") if row.get(k) is None]
        if not isinstance(row, dict) or missing:
            raise RarelmError(f"{where}: line {line_no} lacks {', '.join(missing) or 'fields'}")
        rows.append(row)
    if not rows:
        raise RarelmError(f"{where}: holds no evaluated occurrence")
    return rows


def _yaml_params(text: str, where: str) -> dict[str, str]:
    """params.yaml as the flat, canonical strings that MLflow runs carry (defaults filled in)."""
    import yaml

    from rarelm.params import Params

    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise RarelmError(f"{where}: not valid YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(raw, dict):
        raise RarelmError(f"{where}: not a mapping of params")
    try:
        flat = Params.from_dict(raw).flat()  # the same keys as an MLflow run's params
    except (RarelmError, TypeError, ValueError):
        flat = _flatten(raw)  # params of an older or newer schema: compare what is written
    return {key: canonical(value) for key, value in flat.items()}


def _flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def canonical(value: Any) -> str:
    """One spelling per param value, whether it came from YAML or from MLflow's strings.

    >>> [canonical(v) for v in (0, 0.0, "0.0", 0.7, True, "True", ["test"], '["test"]', "x")]
    ['0', '0', '0', '0.7', 'true', 'true', '["test"]', '["test"]', 'x']
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return format(float(value), ".12g")
    if isinstance(value, (list, dict)) or value is None:
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    text = str(value)
    if text in ("True", "False"):
        return text.lower()
    if re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", text):
        return format(float(text), ".12g")
    if text[:1] in "[{" or text == "null":
        try:
            return canonical(json.loads(text))
        except ValueError:
            pass
    return text


def _load_mlflow(run_id: str) -> RunData:
    from rarelm import tracking

    uri = tracking.tracking_uri()
    client = _mlflow_client(uri)
    try:
        run = client.get_run(run_id)
    except Exception as exc:
        if "RESOURCE_DOES_NOT_EXIST" in str(getattr(exc, "error_code", "")) or "not found" in str(exc):
            raise RarelmError(f"{run_id}: no such MLflow run in {uri}") from None
        raise RarelmError(f"{run_id}: MLflow store {uri} not reachable "
                          f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})") from None
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(run_id, MLFLOW_OCCURRENCES, tmp)
        except Exception:
            raise RarelmError(f"{run_id}: MLflow run has no artifact {MLFLOW_OCCURRENCES} (evaluated before "
                              "per-occurrence results were logged? re-run evaluate)") from None
        rows = parse_occurrences(Path(path).read_text(encoding="utf-8"), f"{run_id}/{MLFLOW_OCCURRENCES}")
        try:
            summary = _json(Path(client.download_artifacts(run_id, MLFLOW_SUMMARY, tmp)).read_text(
                encoding="utf-8"), f"{run_id}/{MLFLOW_SUMMARY}")
        except RarelmError:
            raise
        except Exception:
            summary = {}
    tags = run.data.tags
    name = tags.get("DVC_EXP_NAME") or run.info.run_name or run_id[:8]
    params = {key: canonical(value) for key, value in run.data.params.items()}
    return RunData(run_id, f"{name} ({run_id[:8]})", "mlflow", run_id, params, rows, summary,
                   experiment=tags.get("DVC_EXP_NAME", ""))


def _mlflow_client(uri: str):
    """A client for the store; a SQLite store that does not exist is an error, not a new empty file."""
    from rarelm import tracking

    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        raise RarelmError(f"no MLflow store at {uri} (set MLFLOW_TRACKING_URI?)")
    for key, value in tracking._HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # stderr is for errors
    import logging

    import mlflow

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    return mlflow.MlflowClient(uri)


# ---------------------------------------------------------------- configurations


@dataclasses.dataclass
class Configuration:
    """Replicates (runs that differ only by seed) pooled: one label, values [replicates, occurrences]."""

    label: str
    runs: list[RunData]
    values: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)

    @property
    def seeds(self) -> list[str]:
        return [r.seed for r in self.runs]

    def mean(self, metric: str) -> np.ndarray:
        """Each occurrence's value averaged over the replicates."""
        return self.values[metric].mean(axis=0)


def _config_params(run: RunData) -> dict[str, str]:
    return {k: v for k, v in run.params.items() if k not in REPLICATE_KEYS}


def _differences(params: dict[str, str], base: dict[str, str]) -> list[str]:
    keys = sorted(set(params) | set(base))
    return [f"{k}={params.get(k, '(absent)')}" for k in keys if params.get(k) != base.get(k)]


def group_runs(baseline: list[RunData], runs: list[RunData]) -> list[Configuration]:
    """The baseline configuration first, then one per distinct params-but-seed, in order of appearance.

    A run with the baseline's params (seed aside) joins the baseline as a replicate.
    Replicates have distinct seeds: a run whose seed its configuration already holds
    (same params, same seed: other code, e.g. another commit) starts a configuration
    of its own, labelled with its name. The same run given twice counts once.
    """
    base_params = _config_params(baseline[0])
    for run in baseline[1:]:
        diff = _differences(_config_params(run), base_params)
        if diff:
            raise RarelmError(f"--baseline runs {baseline[0].name} and {run.name} differ in more than "
                              f"the seed ({', '.join(diff[:3])}); give seeds of one configuration")
    seen: set[tuple[str, str]] = set()
    base = Configuration("baseline", [])
    groups: dict[tuple, Configuration] = {((), 0): base}
    for run in [*baseline, *runs]:
        if (run.source, run.ident) in seen:
            continue
        seen.add((run.source, run.ident))
        if any(run is b for b in baseline):
            base.runs.append(run)
            continue
        params = _config_params(run)
        key = () if params == base_params else tuple(sorted(params.items()))
        n = 0
        while (key, n) in groups and run.seed in groups[key, n].seeds:
            n += 1
        if (key, n) not in groups:
            diff = _differences(params, base_params)
            label = ", ".join(diff[:3]) + (f" +{len(diff) - 3} more" if len(diff) > 3 else "")
            if n:
                label = f"{label} ({run.name})" if label else run.name
            groups[key, n] = Configuration(label, [])
        groups[key, n].runs.append(run)
    return list(groups.values())


@dataclasses.dataclass
class Occurrences:
    """What every run shares, in one order: each occurrence's term, train count, band, mention."""

    keys: list[tuple]
    term: np.ndarray  # index into terms
    terms: list[str]
    train_count: np.ndarray
    band: np.ndarray  # band label per occurrence
    mention: np.ndarray  # "first" | "repeat" | "" per occurrence


def _key(row: dict) -> tuple:
    return (str(row["split"]), int(row["doc"]), int(row["char_start"]), str(row["term"]))


def same_occurrences(a: RunData, b: RunData) -> bool:
    """Whether two runs were evaluated on the same term occurrences (so they can be paired)."""
    return sorted(map(_key, a.rows)) == sorted(map(_key, b.rows))


def align(configs: list[Configuration], metrics: Sequence[str]) -> tuple[Occurrences, list[str]]:
    """Pair every run's rows by occurrence; fill each configuration's values.

    Returns the shared occurrences and the metrics that every run holds
    (a metric some run lacks is left out). Different occurrence sets are an error.
    """
    runs = [run for c in configs for run in c.runs]
    first = runs[0]
    by_key: dict[tuple, dict] = {}
    for row in first.rows:
        key = _key(row)
        if key in by_key:
            raise RarelmError(f"{first.name}: occurrence {key} appears twice in its results")
        by_key[key] = row
    keys = sorted(by_key)
    index = {key: i for i, key in enumerate(keys)}
    available = [m for m in metrics
                 if all(all(r.get(METRICS[m][0]) is not None for r in run.rows) for run in runs)]
    n = len(keys)
    for config in configs:
        for m in available:
            config.values[m] = np.empty((len(config.runs), n))
        for i, run in enumerate(config.runs):
            order = np.full(n, -1)
            for j, row in enumerate(run.rows):
                at = index.get(_key(row), -1)
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


def _band(row: dict) -> str:
    """The row's train-count band ("4-7"), from its train count."""
    from rarelm.term_search import band_label

    return band_label(int(row["train_count"]))


def slices(occ: Occurrences) -> list[tuple[str, np.ndarray]]:
    """(name, mask) of every slice reported: all, per mention type, train_count <= 15, per band."""
    out = [("all", np.ones(len(occ.keys), dtype=bool))]
    for kind in ("first", "repeat"):
        mask = occ.mention == kind
        if mask.any():
            out.append((f"{kind} mention", mask))
    out.append((f"train_count<={LOW_COUNT}", occ.train_count <= LOW_COUNT))
    bands = sorted(set(occ.band), key=lambda b: occ.train_count[occ.band == b].min())
    out.extend((f"band {b}", occ.band == b) for b in bands)
    return out


# ---------------------------------------------------------------- the comparison


def compare(baseline: list[RunData], runs: list[RunData], metrics: Sequence[str] = tuple(METRICS),
            n_boot: int = 2000, seed: int = 0) -> dict:
    """Every number of the report, as a JSON-able dict (see `markdown` and `html_report` for views)."""
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
    base = configs[0]
    weights = _all_seed_weights(configs, n_boot, seed)
    rows = []
    for metric in available:
        per_seed = {id(c): np.stack([term_sums(occ.term, n_terms, v, masks)[0] for v in c.values[metric]])
                    for c in configs}
        base_sums = per_seed[id(base)].mean(axis=0)
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
    """RUN_METRICS of eval.json per configuration: mean over seeds, its interval, the difference to
    the baseline (paired by seed when the seeds are the same) and the relative change."""
    base = configs[0]
    rows = []
    for key in RUN_METRICS:
        base_values = _run_values(base, key)
        if base_values is None:
            continue
        for config in configs:
            values = _run_values(config, key)
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


def _run_values(config: Configuration, key: str) -> list[float] | None:
    """The key's value in every replicate's eval.json, or None if some replicate lacks it."""
    values = [r.summary.get(key) for r in config.runs]
    if any(not isinstance(v, (int, float)) or isinstance(v, bool) for v in values):
        return None
    return [float(v) for v in values]


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


# ---------------------------------------------------------------- views


def _fmt(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "n/a"
    return f"{x:+.4f}" if signed else f"{x:.4f}"


def _fmt_p(p: float | None) -> str:
    if p is None:
        return ""
    return f"{p:.3g}" if p < 0.001 else f"{p:.4f}"


def _over(row: dict) -> str:
    return row["slice"] + (", per term" if row["aggregate"] == "terms" else "")


def main_rows(report: dict) -> list[dict]:
    """The rows that the markdown table shows: main slices; per term only for all and train_count<=15."""
    per_term = {"all", f"train_count<={LOW_COUNT}"}
    rows = [r for r in report["rows"] if r["slice"] in MAIN_SLICES
            and (r["aggregate"] == "occurrences" or r["slice"] in per_term)]
    order = {name: i for i, name in enumerate(MAIN_SLICES)}
    labels = {c["label"]: i for i, c in enumerate(report["configurations"])}
    metrics = {m: i for i, m in enumerate(report["metrics"])}
    return sorted(rows, key=lambda r: (metrics[r["metric"]], order[r["slice"]],
                                       r["aggregate"] == "terms", labels[r["configuration"]]))


def _ci(row: dict, prefix: str = "diff") -> str:
    if row.get(f"{prefix}_lo") is None:
        return ""
    signed = prefix != "value"
    return f"[{_fmt(row[f'{prefix}_lo'], signed)}, {_fmt(row[f'{prefix}_hi'], signed)}]"


def _rests_on(report: dict) -> str:
    b = report["bootstrap"]
    lower = ", ".join(report["lower_is_better"])
    return (f"{report['occurrences']} term occurrences of {report['terms']} terms (split "
            f"{', '.join(report['splits'])}), paired across runs. 95% CI: bootstrap over terms and seeds "
            f"together ({b['resamples']} resamples, seed {b['seed']}): each row's interval rests on its "
            f"seeds (the baseline's: {len(report['configurations'][0]['runs'])}) and terms. p: exact sign "
            f"test over terms. Lower is better: {lower or 'none of these'}.")


def run_table(report: dict) -> list[list[str]]:
    """Rows of the run-level table: eval.json figures with intervals over seeds."""
    return [[r["configuration"], str(r["seeds"]), r["metric"], f"{r['value']:.4g}", _ci(r, "value"),
             _fmt(r.get("diff"), True) if "diff" in r else "", _ci(r),
             f"{r['relative']:+.1%}" if r.get("relative") is not None else ""]
            for r in report.get("run_rows", [])]


RUN_HEADER = ["configuration", "seeds", "metric", "mean", "95% CI", "diff vs baseline", "95% CI", "relative"]


def markdown(report: dict) -> str:
    """The difference table, the run-level table and which runs make each configuration, as markdown."""
    lines = ["# rarelm compare", ""]
    for c in report["configurations"]:
        runs = ", ".join(f"{r['name']} (seed {r['seed']})" for r in c["runs"])
        lines.append(f"- **{c['label']}**: {runs}")
    lines += ["", _rests_on(report), ""]
    if report["left_out"]:
        lines += [f"Left out (not in every run): {', '.join(report['left_out'])}.", ""]
    lines += ["| configuration | seeds | terms | metric | over | value | diff vs baseline | 95% CI | p |",
              "| --- | ---: | ---: | --- | --- | ---: | ---: | --- | ---: |"]
    for r in main_rows(report):
        diff = _fmt(r["diff"], True) if "diff" in r else ""
        lines.append(f"| {r['configuration']} | {r['seeds']} | {r['terms']} | {r['metric']} | {_over(r)} | "
                     f"{_fmt(r['value'])} | {diff} | {_ci(r)} | {_fmt_p(r.get('p'))} |")
    table = run_table(report)
    if table:
        lines += ["", "Run-level figures (metrics/eval.json of each run; 95% t interval over seeds, paired "
                  "by seed when both sides have the same seeds; none with one seed):", "",
                  "| " + " | ".join(RUN_HEADER) + " |",
                  "| --- | ---: | --- | ---: | --- | ---: | --- | ---: |"]
        lines += ["| " + " | ".join(row) + " |" for row in table]
    return "\n".join(lines) + "\n"


def _figures() -> Any:
    """matplotlib.pyplot with the Agg backend and reproducible SVG, or None without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "rarelm", "svg.fonttype": "none", "font.size": 9})
    return plt


def _svg(plt, fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def curve_svg(report: dict, plt, metric: str = "exact_match") -> str:
    """A metric per train-count band, one line per configuration with its bootstrap band."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    xs = report["curve_x"]
    for c in report["configurations"]:
        rows = [r for r in report["rows"] if r["configuration"] == c["label"] and r["metric"] == metric
                and r["aggregate"] == "occurrences" and r["slice"] in xs]
        rows.sort(key=lambda r: xs[r["slice"]])
        x = [xs[r["slice"]] for r in rows]
        label = f"{c['label']} ({len(c['runs'])} seed{'s' if len(c['runs']) > 1 else ''})"
        line, = ax.plot(x, [r["value"] for r in rows], marker="o", label=label)
        ax.fill_between(x, [r["value_lo"] for r in rows], [r["value_hi"] for r in rows],
                        color=line.get_color(), alpha=0.15, linewidth=0)
    ax.set_xscale("symlog", linthresh=1)
    if metric not in LOWER_IS_BETTER:
        ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("train count of the term (mean of its band; log scale)")
    ax.set_ylabel({"exact_match": "term exact match", "nll_per_char": "term NLL per character (nats)"}
                  .get(metric, metric))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _svg(plt, fig)


def ppl_svg(report: dict, plt) -> str | None:
    """Perplexity per token bucket (eval.json, mean over seeds), grouped bars per configuration."""
    keys = [k for k in PPL_KEYS if any(k in c["summary"] for c in report["configurations"])]
    if not keys:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    width = 0.8 / len(report["configurations"])
    for i, c in enumerate(report["configurations"]):
        x = [j + i * width for j, k in enumerate(keys) if k in c["summary"]]
        bars = ax.bar(x, [c["summary"][k] for k in keys if k in c["summary"]], width, label=c["label"])
        ax.bar_label(bars, fmt="%.3g", fontsize=7)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))], [k.removeprefix("ppl_") for k in keys])
    ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylabel("perplexity (log scale)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return _svg(plt, fig)


def _table(header: list[str], body: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
                   for row in body)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def html_report(report: dict) -> str:
    """One self-contained page: figures inline as SVG, the difference, run-level and mention tables, and
    the term-only intervals (seeds averaged per occurrence) as a secondary view."""
    plt = _figures()
    curves = []
    for metric in ("exact_match", "nll_per_char"):
        if metric in report["metrics"]:
            curves.append(f"<h2>{html.escape(metric)} by the term's train count</h2>\n"
                          + (curve_svg(report, plt, metric) if plt else "<p>(figures need matplotlib)</p>"))
    ppl = (ppl_svg(report, plt) if plt else None) or "<p>(no per-bucket perplexity, or no matplotlib)</p>"
    mention = [[r["configuration"], r["metric"], r["slice"], r["occurrences"], _fmt(r["value"]),
                _ci(r, "value")]
               for r in report["rows"] if r["aggregate"] == "occurrences"
               and r["slice"] in ("first mention", "repeat mention")]
    diffs = [[r["configuration"], r["seeds"], r["terms"], r["metric"], _over(r), _fmt(r["value"]),
              _fmt(r.get("diff"), True) if "diff" in r else "", _ci(r), _fmt_p(r.get("p"))]
             for r in main_rows(report)]
    pooled = [[r["configuration"], r["seeds"], r["terms"], r["metric"], _over(r), _fmt(r["diff"], True),
               _ci(r), _ci(r, "pooled")] for r in main_rows(report) if "diff" in r]
    runs = "".join(f"<li><b>{html.escape(c['label'])}</b>: "
                   + html.escape(", ".join(f"{r['name']} (seed {r['seed']})" for r in c["runs"])) + "</li>"
                   for c in report["configurations"])
    style = ("body{font-family:sans-serif;max-width:60em;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;font-size:90%}td,th{border:1px solid #ccc;padding:2px 6px}"
             "td:nth-child(n+4){text-align:right}svg{max-width:100%;height:auto}")
    newline = "\n"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>rarelm compare</title><style>{style}</style></head>
<body>
<h1>rarelm compare</h1>
<ul>{runs}</ul>
<p>{html.escape(_rests_on(report))} Replicates (runs differing only by seed) are drawn with the terms in
every resample.</p>
{newline.join(curves)}
<h2>Perplexity by token bucket</h2>
{ppl}
<h2>Differences to the baseline</h2>
{_table(["configuration", "seeds", "terms", "metric", "over", "value", "diff vs baseline", "95% CI", "p"],
        diffs)}
<h2>Run-level figures (eval.json, intervals over seeds)</h2>
{_table(RUN_HEADER, run_table(report))}
<h2>First and repeat mentions</h2>
{_table(["configuration", "metric", "mention", "occurrences", "value", "95% CI"], mention)}
<h2>Secondary: term-only intervals, seeds averaged per occurrence</h2>
<p>The interval earlier versions reported: terms resampled, each occurrence's value averaged over the
seeds first, so training noise is only in it as far as the seeds average it out. Beside the
terms-and-seeds interval for comparison.</p>
{_table(["configuration", "seeds", "terms", "metric", "over", "diff", "95% CI (terms x seeds)",
         "95% CI (terms only)"], pooled)}
</body></html>
"""


def write_report(report: dict, out: str | Path) -> list[Path]:
    """index.html, report.md and report.json in `out`, each written atomically."""
    from rarelm.files import atomic_file, write_json

    out = Path(out)
    page = html_report(report)
    paths = [out / "index.html", out / "report.md", out / "report.json"]
    with atomic_file(paths[0]) as f:
        f.write(page)
    with atomic_file(paths[1]) as f:
        f.write(markdown(report))
    write_json(paths[2], report)
    return paths


def baseline_mlflow_run(run: RunData, repo: Path) -> str | None:
    """The MLflow run id behind a run: its own, the workspace model's, or the experiment's by tag."""
    if run.source == "mlflow":
        return run.ident
    if run.source == WORKSPACE:
        info = repo / "models" / "model" / "mlflow_run.json"
        if info.is_file():
            return json.loads(info.read_text(encoding="utf-8")).get("run_id")
        return None
    if run.experiment and "'" not in run.experiment:
        from rarelm import tracking

        client = _mlflow_client(tracking.tracking_uri())
        found = client.search_experiments()
        ids = [e.experiment_id for e in found]
        runs = client.search_runs(ids, f"tags.DVC_EXP_NAME = '{run.experiment}'",
                                  order_by=["attributes.start_time DESC"], max_results=1)
        return runs[0].info.run_id if runs else None
    return None


def log_to_mlflow(paths: list[Path], baseline: RunData, repo: str | Path = ".") -> str | None:
    """Log the report files into the baseline's MLflow run under `compare/`; never raises.

    Returns the run id, or None after one warning line on stderr.
    """
    from rarelm import tracking

    try:
        run_id = baseline_mlflow_run(baseline, Path(repo))
        if run_id is None:
            print(f"rarelm compare: warning: no MLflow run known for {baseline.name}; report not logged",
                  file=sys.stderr)
            return None
        client = _mlflow_client(tracking.tracking_uri())
        for path in paths:
            client.log_artifact(run_id, str(path), "compare")
        return run_id
    except Exception as exc:  # tracking never fails the command
        reason = tracking.redact(" ".join(str(exc).split())[:200])
        print(f"rarelm compare: warning: MLflow tracking store {tracking.redact(tracking.tracking_uri())} "
              f"is not reachable ({type(exc).__name__}: {reason}); report not logged", file=sys.stderr)
        return None
