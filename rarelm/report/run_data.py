"""One evaluated run as `rarelm compare` reads it: its params, its per-occurrence rows, its eval.json.

The evaluate stage writes one row per evaluated term occurrence
(metrics/eval_occurrences.jsonl; `eval/eval_occurrences.jsonl` in the run's MLflow
artifacts): the term, its train count and band, first or repeat mention, and
whether the model wrote it (`exact_match`, `first_token_hit`), its NLL and the
rank of the true term among all candidates (`choice_rank`; 1 = closed-set choice
right). An occurrence is identified by (split, doc, char_start, term), so two
runs evaluated on the same data hold exactly the same occurrences.

    >>> occurrence_key({"split": "test", "doc": "3", "char_start": 17, "term": "x"})
    ('test', 3, 17, 'x')
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from typing import Any

import yaml

from rarelm.errors import RarelmError
from rarelm.params import Params
from rarelm.paths import EVAL_METRICS, EVAL_OCCURRENCES, PARAMS
from rarelm.tracking.metrics import leaves

MLFLOW_OCCURRENCES = "eval/eval_occurrences.jsonl"
MLFLOW_SUMMARY = "eval/eval.json"
WORKSPACE = "workspace"
KEY_FIELDS = ("split", "doc", "char_start", "term")  # what identifies an occurrence


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


def occurrence_key(row: dict) -> tuple:
    """(split, doc, char_start, term): the same occurrence in every run evaluated on the same data."""
    return (str(row["split"]), int(row["doc"]), int(row["char_start"]), str(row["term"]))


def split_summary(summary: dict, params: dict[str, str], split: str) -> dict:
    """eval.json's figures for one split: the top level is eval.splits' first, the others nest.

    >>> split_summary({"ppl": 2.0, "val": {"ppl": 3.0}}, {"eval.splits": '["test", "val"]'}, "val")
    {'ppl': 3.0}
    >>> split_summary({"ppl": 2.0}, {}, "val")      # a split the run did not score
    {}
    >>> split_summary({"ppl_general": 5.0}, {}, "test")  # older record, nothing mixed: the model alone
    {'ppl_general': 5.0, 'ppl_general_model': 5.0}
    >>> split_summary({"ppl_general": 6.0}, {"knn.cache_window": "64", "knn.cache_weight": "0.1"}, "test")
    {'ppl_general': 6.0}
    """
    if isinstance(summary.get(split), dict):
        return summary[split]
    try:
        first = json.loads(params.get("eval.splits", '["test"]'))[0]
    except (ValueError, IndexError, TypeError):
        first = "test"
    out = {k: v for k, v in summary.items() if not isinstance(v, dict)} if first == split else {}
    if "ppl_general" in out and "ppl_general_model" not in out and not _mixed(params):
        out["ppl_general_model"] = out["ppl_general"]  # a record from before the key: the model alone
    return out


def _mixed(params: dict[str, str]) -> bool:
    """Whether the run mixed kNN-LM or the cache into its distributions (rarelm.knn.hook.active).

    >>> _mixed({"knn.cache_window": "128", "knn.cache_weight": "0.1"}), _mixed({"knn.enabled": "false"})
    (True, False)
    """
    def number(key: str) -> float:
        try:
            return float(params.get(key, "0"))
        except ValueError:
            return 0.0

    store = params.get("knn.enabled", "false").lower() == "true" and number("knn.weight") > 0
    return store or (number("knn.cache_weight") > 0 and number("knn.cache_window") > 0)


def load_files(ref: str, name: str, source: str, ident: str, read: Callable[[str], str | None]) -> RunData:
    """A run from its files: `read(relative path)` gives a file's text, or None if it is absent."""
    where = "in the workspace" if source == WORKSPACE else f"at {ref}"
    text = read(EVAL_OCCURRENCES)
    if text is None:
        raise RarelmError(f"{ref}: no {EVAL_OCCURRENCES} {where} (evaluated before per-occurrence results "
                          "were written? re-run evaluate)")
    rows = parse_occurrences(text, f"{EVAL_OCCURRENCES} {where}")
    params_text = read(PARAMS)
    if params_text is None:
        raise RarelmError(f"{ref}: no {PARAMS} {where}")
    summary_text = read(EVAL_METRICS)
    summary = parse_json(summary_text, f"{EVAL_METRICS} {where}") if summary_text else {}
    return RunData(ref, name, source, ident, _yaml_params(params_text, f"{PARAMS} {where}"), rows, summary)


def parse_json(text: str, where: str) -> Any:
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
        missing = [k for k in (*KEY_FIELDS, "train_count", "exact_match") if row.get(k) is None]
        if not isinstance(row, dict) or missing:
            raise RarelmError(f"{where}: line {line_no} lacks {', '.join(missing) or 'fields'}")
        rows.append(row)
    if not rows:
        raise RarelmError(f"{where}: holds no evaluated occurrence")
    return rows


def _yaml_params(text: str, where: str) -> dict[str, str]:
    """params.yaml as the flat, canonical strings that MLflow runs carry (defaults filled in)."""
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise RarelmError(f"{where}: not valid YAML ({' '.join(str(exc).split())})") from None
    if not isinstance(raw, dict):
        raise RarelmError(f"{where}: not a mapping of params")
    try:
        flat = Params.from_dict(raw).flat()  # the same keys as an MLflow run's params
    except (RarelmError, TypeError, ValueError):
        flat = leaves(raw)  # params of an older or newer schema: compare what is written
    return {key: canonical(value) for key, value in flat.items()}


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

