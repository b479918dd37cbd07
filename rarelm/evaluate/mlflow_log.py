"""The `evaluate` stage's results into the MLflow run that trained the model: the `summary/`
metrics first (`log_eval_metrics`, before any output is written), then the written files
(`log_eval_files`): every other figure is in the artifact `eval/eval.json`, not a metric
(rarelm/tracking/metrics.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rarelm.tracking.metrics import summary_metrics
from rarelm.tracking.redaction import redact


def log_eval_metrics(run, metrics: dict, inputs: list[str | Path]) -> None:
    """Log the `summary/` metrics of eval.json's first split (the other figures go as the artifact
    `eval/eval.json`) and `inputs` as "evaluation" datasets (digests from dvc.lock) into `run`
    (rarelm.tracking.run.open_run), then `run.require()`: before any output is written, a store
    that cannot log is the stage's one-line error when `tracking.required` is on."""
    run.log_metrics(summary_metrics(metrics))
    # the decode-time settings behind these figures: tags, not metrics
    settings = {f"eval.{key}": str(metrics[key])
                for key in ("logit_adjust_tau", "term_trie", "term_trie_min_mass") if key in metrics}
    if "retrieval" in metrics:
        settings["retrieval"] = str(metrics["retrieval"])
    if settings:
        run.set_tags(settings)
    run.log_datasets(list(inputs), context="evaluation")
    run.require()


def log_eval_files(run, files: list[Path], log_text: bool) -> None:
    """The written outputs as artifacts under `eval/`, and finish the run.

    The per-occurrence rows (the .jsonl among `files`: expected term beside what the model
    wrote, test-corpus text) go only when `log_text` (tracking.log_text): as an artifact and
    as the MLflow table `eval/term_samples.json`. A failure here is one warning line; the
    stage's outputs stand.
    """
    for path in files:
        if Path(path).suffix == ".jsonl" and log_text:
            with open(path, encoding="utf-8") as f:
                run.log_table([json.loads(line) for line in f], "eval/term_samples.json")
    if run.active:
        try:
            import mlflow  # ~2 s, and only for an active run: rarelm.tracking imports it as lazily

            client = mlflow.MlflowClient(run.tracking_uri)
            for path in files:
                if Path(path).suffix != ".jsonl" or log_text:
                    client.log_artifact(run.run_id, str(path), artifact_path="eval")
        except Exception as exc:  # the store answered but artifacts failed: still only a warning
            print(f"rarelm evaluate: warning: MLflow artifacts not logged ({type(exc).__name__}: "
                  f"{redact(' '.join(str(exc).split())[:200])})", file=sys.stderr)
    run.finish()
