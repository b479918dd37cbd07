"""Runs in an MLflow store: reading a run's per-occurrence results, logging a report into a run.

A SQLite store that does not exist is an error here, never a new empty file:

    >>> mlflow_client("sqlite:///no/such/mlflow.db")
    Traceback (most recent call last):
    rarelm.errors.RarelmError: no MLflow store at sqlite:///no/such/mlflow.db (set MLFLOW_TRACKING_URI?)
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
from pathlib import Path

from rarelm.errors import RarelmError
from rarelm.paths import MLFLOW_RUN, MODEL
from rarelm.report.run_data import (
    MLFLOW_OCCURRENCES,
    MLFLOW_SUMMARY,
    WORKSPACE,
    RunData,
    canonical,
    parse_json,
    parse_occurrences,
)
from rarelm.tracking.redaction import redact
from rarelm.tracking.uri import set_http_defaults, tracking_uri


def mlflow_client(uri: str):
    """A client for the store; a SQLite store that does not exist is an error, not a new empty file."""
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():
        raise RarelmError(f"no MLflow store at {uri} (set MLFLOW_TRACKING_URI?)")
    set_http_defaults()
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # stderr is for errors
    import mlflow  # takes ~2 s to import; only a comparison that reads or logs MLflow runs needs it

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    return mlflow.MlflowClient(uri)


def load_mlflow_run(run_id: str) -> RunData:
    """An MLflow run's per-occurrence rows (eval/), eval.json and params; a one-line error if absent."""
    uri = tracking_uri()
    client = mlflow_client(uri)
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
            summary = parse_json(Path(client.download_artifacts(run_id, MLFLOW_SUMMARY, tmp)).read_text(
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


def baseline_mlflow_run(run: RunData, repo: Path) -> str | None:
    """The MLflow run id behind a run: its own, the workspace model's, or the experiment's by tag."""
    return mlflow_run_id(run.source, run.ident, run.experiment, repo)


def mlflow_run_id(source: str, ident: str, experiment: str, repo: Path, uri: str | None = None) -> str | None:
    """The MLflow run id behind a run of a report (RunData's source, ident and experiment): its own
    (source "mlflow"), the workspace model's (models/model/mlflow_run.json), the newest with the DVC
    experiment's name as tag DVC_EXP_NAME; None for a git revision."""
    if source == "mlflow":
        return ident
    if source == WORKSPACE:
        info = Path(repo) / MODEL / MLFLOW_RUN
        if info.is_file():
            return json.loads(info.read_text(encoding="utf-8")).get("run_id")
        return None
    if experiment and "'" not in experiment:
        client = mlflow_client(uri or tracking_uri())
        found = client.search_experiments()
        ids = [e.experiment_id for e in found]
        runs = client.search_runs(ids, f"tags.DVC_EXP_NAME = '{experiment}'",
                                  order_by=["attributes.start_time DESC"], max_results=1)
        return runs[0].info.run_id if runs else None
    return None


def log_report(paths: list[Path], baseline: RunData, repo: str | Path = ".") -> str | None:
    """Log the report files into the baseline's MLflow run under `compare/`; never raises.

    Returns the run id, or None after one warning line on stderr.
    """
    try:
        run_id = baseline_mlflow_run(baseline, Path(repo))
        if run_id is None:
            print(f"rarelm compare: warning: no MLflow run known for {baseline.name}; report not logged",
                  file=sys.stderr)
            return None
        client = mlflow_client(tracking_uri())
        for path in paths:
            client.log_artifact(run_id, str(path), "compare")
        return run_id
    except Exception as exc:  # tracking never fails the command
        reason = redact(" ".join(str(exc).split())[:200])
        print(f"rarelm compare: warning: MLflow tracking store {redact(tracking_uri())} "
              f"is not reachable ({type(exc).__name__}: {reason}); report not logged", file=sys.stderr)
        return None
