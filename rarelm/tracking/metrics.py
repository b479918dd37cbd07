"""Which figures become MLflow metrics, under which names.

Only what a person compares across runs is an MLflow metric, one prefix per family (the
UI draws one chart section per prefix, sections in name order): `summary/<k>` the few to
read first (SUMMARY), `train/<k>` and `val/<k>` the step curves, `system/<k>` MLflow's
system metrics (CHARTED). Everything else a stage measures is one JSON artifact per stage:
`final/train.json` (metrics/train.json), `eval/eval.json` (metrics/eval.json, every split),
`upstream.json` (the earlier stages' metrics/<stage>.json); settings are tags. A run's
Model metrics tab thus opens on `summary/`, not on ~100 single-bar charts.

    >>> measured(summary_metrics({"ppl": 3.5, "n_eval_terms": 9}) | {"eval/ppl": 3.5, "final/loss": 2.0})
    {'summary/ppl': 3.5}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# summary/<name>: the metrics file key behind it; a short family that a person reads first
SUMMARY = {"term_nll_per_char": "term_nll_per_char", "term_token_acc": "term_token_acc",
           "term_exact_match": "term_exact_match",
           "term_exact_match_le15": "term_exact_match_le15", "false_insertion": "false_insertion_rate",
           "ppl": "ppl", "ppl_frequent": "ppl_frequent", "em50_train_count": "em50_train_count",
           "ppl_general": "ppl_general", "ppl_general_outside": "ppl_general_outside",
           "tokens_per_s": "tokens_per_s"}
# the metric families logged to MLflow: what a person compares across runs
CHARTED = ("summary/", "train/", "val/", "system/")
# metrics-file keys that count or restate settings: never metrics, whatever the family (`n_*` too)
NOT_MEASURED = {"steps", "tokens", "epochs", "parameters", "trainable_parameters", "state_bytes_per_rank",
                "gen_unique_tokens", "human_unique_tokens", "logit_adjust_tau", "term_trie",
                "term_trie_min_mass", "retrieval"}


def leaves(data: Any, prefix: str = "", sep: str = ".") -> dict[str, Any]:
    """Every leaf of nested dicts, keyed by its path: {"a.b": value}.

    >>> leaves({"train": {"lr": 0.1, "name": "x"}, "targets": ["test"]})
    {'train.lr': 0.1, 'train.name': 'x', 'targets': ['test']}
    """
    if not isinstance(data, dict):
        return {prefix.removesuffix(sep): data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(leaves(value, f"{prefix}{key}{sep}", sep))
    return out


def flatten(data: Any, prefix: str = "", sep: str = ".") -> dict[str, float]:
    """Numeric leaves of nested dicts as {"a.b": 1.0}; strings and lists are skipped.

    >>> flatten({"train": {"tokens": 10, "name": "x"}, "vocab": 5}, "tokenize.")
    {'tokenize.train.tokens': 10.0, 'tokenize.vocab': 5.0}
    """
    return {key: float(value) for key, value in leaves(data, prefix, sep).items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)}


def upstream_metrics(metrics_dir: str | Path, stages: list[str]) -> dict[str, float]:
    """metrics/<stage>.json of every stage that has one, as "upstream/<stage>/<key>"."""
    out: dict[str, float] = {}
    for stage in stages:
        path = Path(metrics_dir) / f"{stage}.json"
        if path.is_file():
            try:
                out.update(flatten(json.loads(path.read_text(encoding="utf-8")),
                                   f"upstream/{stage}/", sep="/"))
            except (OSError, ValueError):
                continue  # a broken metrics file is that stage's problem, not tracking's
    return out


def summary_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The `summary/` family from a metrics file's dict (eval.json or train.json): what exists of it.

    >>> summary_metrics({"term_exact_match": 0.5, "term_token_acc": 0.8, "n_eval_terms": 9, "ppl": None})
    {'summary/term_token_acc': 0.8, 'summary/term_exact_match': 0.5}
    """
    return {f"summary/{name}": float(metrics[key]) for name, key in SUMMARY.items()
            if isinstance(metrics.get(key), (int, float)) and not isinstance(metrics[key], bool)}


def summary_file(eval_metrics: dict[str, Any], splits: list[str],
                 train_metrics: dict[str, Any] | None = None) -> dict[str, Any]:
    """metrics/summary.json, the one file dvc.yaml declares as `metrics:` (what `dvc exp show` and
    `dvc metrics show` open on): SUMMARY's figures of eval.json (among them `ppl_general`,
    general-text perplexity where measured: the forgetting guard unless kNN-LM or the cache is mixed
    in, when eval.json's `ppl_general_model` is; and `ppl_general_outside`, on text from outside the
    base's family), the first split's at the top level and the others' under their name as in eval.json,
    then training's `tokens_per_s` (train.json). None stays None: a figure that is undefined for this
    run (em50_train_count) keeps its column.

    >>> summary_file({"ppl": 2.0, "em50_train_count": None, "n_eval_terms": 9, "val": {"ppl": 3.0}},
    ...              ["test", "val"], {"tokens_per_s": 9.5, "loss": 1.0})
    {'ppl': 2.0, 'em50_train_count': None, 'tokens_per_s': 9.5, 'val': {'ppl': 3.0}}
    """
    keys = [key for key in SUMMARY.values() if key != "tokens_per_s"]

    def headline(metrics: dict[str, Any]) -> dict[str, Any]:
        return {key: metrics[key] for key in keys if key in metrics}

    out = headline(eval_metrics)
    if train_metrics and "tokens_per_s" in train_metrics:
        out["tokens_per_s"] = train_metrics["tokens_per_s"]
    for split in splits[1:]:
        out[split] = headline(eval_metrics.get(split) or {})
    return out


def measured(metrics: dict[str, float]) -> dict[str, float]:
    """The MLflow metrics of `metrics`: the CHARTED families, without counts and constants
    (NOT_MEASURED, `n_*`); `final/`, `eval/` and the rest stay in the stage's JSON artifact.

    >>> measured({"train/loss": 2.0, "summary/ppl": 3.0, "final/loss": 2.0, "eval/ppl": 3.0,
    ...           "train/n_x": 1.0})
    {'train/loss': 2.0, 'summary/ppl': 3.0}
    """
    def counted(key: str) -> bool:
        name = key.rsplit("/", 1)[-1]
        return name.startswith("n_") or name in NOT_MEASURED

    return {k: v for k, v in metrics.items() if k.startswith(CHARTED) and not counted(k)}
