"""The winner of a comparison, registered by `rarelm compare --register` and `rarelm headline --register`.

The best configuration is the one with the best value of the ranking metric over all
occurrences: term NLL per character (lower first; ties: term-token accuracy, higher first;
a report without it: its first metric), the baseline included, so a remedy that does not
beat the baseline does not win. With a guard (the headline plan's), a configuration whose
overall perplexity or false-insertion rate is beyond its tolerance of the baseline's is out:

    >>> row = lambda c, v: {"configuration": c, "slice": "all", "aggregate": "occurrences",
    ...                     "metric": "nll_per_char", "value": v}
    >>> report = {"metrics": ["nll_per_char"], "lower_is_better": ["nll_per_char"],
    ...           "configurations": [{"label": "base", "summary": {"ppl": 10.0}},
    ...                              {"label": "alpha=0.7", "summary": {"ppl": 10.1}},
    ...                              {"label": "alpha=1", "summary": {"ppl": 11.0}}],
    ...           "rows": [row("base", 1.30), row("alpha=0.7", 1.25), row("alpha=1", 1.10)]}
    >>> best_configuration(report)["label"], best_configuration(report, {"ppl": 0.02})["label"]
    ('alpha=1', 'alpha=0.7')

Its run is the configuration's first (the first seed given, or the plan's first final seed);
it is registered as `rarelm register` does (description with a `chosen:` line, tags), and the
`champion` alias never moves.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from rarelm.errors import RarelmError
from rarelm.report.compare import in_baseline_tokens, report_row
from rarelm.report.headline_plan import RANK_METRIC, RANK_SLICE, TIE_METRIC
from rarelm.report.mlflow_runs import mlflow_run_id
from rarelm.tracking import registry


def within_guard(summary: dict, base: dict, guard: dict[str, float]) -> bool:
    """Whether each `guard` figure (key -> relative tolerance) is at most the baseline's times
    (1 + tolerance); a figure either side lacks does not exclude. A perplexity is taken in the
    baseline's tokens (`in_baseline_tokens`), so another tokenizer (terms as tokens) is judged on
    the same text's NLL, not on how many tokens it cut the text into.

    >>> [within_guard({"ppl": p}, {"ppl": 10.0}, {"ppl": 0.02}) for p in (10.1, 10.3)]
    [True, False]
    >>> within_guard({"ppl": 10.3, "n_eval_tokens": 99}, {"ppl": 10.0, "n_eval_tokens": 100}, {"ppl": 0.02})
    True
    """
    return all(base.get(key) is None or summary.get(key) is None
               or in_baseline_tokens(summary, base, key) <= base[key] * (1 + tolerance)
               for key, tolerance in guard.items())


def _value(report: dict, label: str, metric: str) -> float | None:
    value = report_row(report, label, RANK_SLICE, metric).get("value")
    return None if value is None or not math.isfinite(value) else float(value)


def best_configuration(report: dict, guard: dict[str, float] | None = None,
                       tie_metric: str = TIE_METRIC) -> dict:
    """The report's best configuration (its entry in report["configurations"]); ties of the ranking
    metric broken by `tie_metric` (higher first, a headline plan's), then the first."""
    metric = RANK_METRIC if RANK_METRIC in report["metrics"] else report["metrics"][0]
    sign = 1.0 if metric in report["lower_is_better"] else -1.0
    tie = tie_metric if tie_metric in report["metrics"] and tie_metric != metric else None
    configs = report["configurations"]
    base = configs[0]["summary"]

    def key(config: dict) -> tuple[float, float]:
        value, second = _value(report, config["label"], metric), tie and _value(report, config["label"], tie)
        return (math.inf if value is None else sign * value, -second if second is not None else 0.0)

    allowed = [configs[0], *(c for c in configs[1:] if within_guard(c["summary"], base, guard or {}))]
    return min(allowed, key=key)


@dataclasses.dataclass
class Registration:
    """The winner, checked against the registry before any output is written; `register()` after."""

    client: object
    name: str  # the registered model (tracking.registered_model)
    label: str
    run_id: str
    chosen: str  # the description's `chosen:` line

    def register(self) -> str:
        """A new version (never the `champion` alias): `models:/<name>/<version>`."""
        version = registry.register(self.client, self.name, self.run_id, champion=False, chosen=self.chosen)
        return f"models:/{self.name}/{version}"


def prepare_registration(report: dict, repo: str | Path, params_file: str | Path, by: str,
                         guard: dict[str, float] | None = None, uri: str | None = None,
                         tie_metric: str = TIE_METRIC) -> Registration:
    """The report's winner as a registration; a one-line error if the registry or the store
    cannot take it (no store, no registered model name, a git revision without an MLflow run, a
    run that logged no model)."""
    client, params = registry.open_registry(params_file, uri)
    config = best_configuration(report, guard, tie_metric)
    run = config["runs"][0]
    run_id = mlflow_run_id(run["source"], run["id"], run["experiment"], Path(repo), uri)
    if run_id is None:
        raise RarelmError(f"--register: the best configuration {config['label']} ({run['name']}) has no "
                          "MLflow run (a git revision?); register a run by hand with `rarelm register RUN`")
    registry.logged_model_id(client.get_run(run_id))  # one line if it logged no model
    metric = RANK_METRIC if RANK_METRIC in report["metrics"] else report["metrics"][0]
    chosen = (f"{by}, best {metric} over all occurrences among {len(report['configurations'])} "
              f"configurations, baseline included: {config['label']}, seed {run['seed']} "
              f"(run 1 of {len(config['runs'])})")
    return Registration(client, params.tracking.registered_model, config["label"], run_id, chosen)
