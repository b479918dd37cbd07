"""Which MLflow store: `$MLFLOW_TRACKING_URI`, else the repo's embedded SQLite store.

The repo root is `$DVC_ROOT` (set by DVC, even inside the temporary copies that
queued experiments run in) or the current folder:

    >>> artifact_location("sqlite:////repo/mlflow.db", "rarelm")
    '/repo/mlruns/rarelm'
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from rarelm.tracking.redaction import redact

# network calls are bounded, so a down server costs seconds, not minutes (unless set)
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
                 "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
                 "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}  # no bar in a stage's log


def set_http_defaults() -> None:
    """Put HTTP_DEFAULTS into the environment where it does not say otherwise."""
    for key, value in HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)


def repo_root() -> Path:
    """$DVC_ROOT if set (the real workspace, even in an experiment's temp copy), else cwd."""
    return Path(os.environ.get("DVC_ROOT") or os.getcwd()).resolve()


def tracking_uri() -> str:
    """$MLFLOW_TRACKING_URI, else sqlite:///<repo root>/mlflow.db (absolute)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{repo_root() / 'mlflow.db'}"


def is_default_store(uri: str) -> bool:
    """Whether `uri` is the repo's own embedded store, sqlite:///<repo root>/mlflow.db."""
    return not os.environ.get("MLFLOW_TRACKING_URI") and uri == tracking_uri()


def run_file_uri(uri: str) -> str:
    """The store as the run file records it: the repo's own store relative to the repo root
    (so a copied checkout's model names the copy's store), any other redacted.

    >>> run_file_uri("http://alice:s3cret@mlflow:5000")
    'http://***@mlflow:5000'
    """
    return "sqlite:///mlflow.db" if is_default_store(uri) else redact(uri)


def logs_text(log_text: str, uri: str) -> bool:
    """Whether test-corpus text goes to the store: tracking.log_text, `auto` = a store on this machine.

    >>> logs_text("auto", "sqlite:////repo/mlflow.db"), logs_text("auto", "https://mlflow.example.com")
    (True, False)
    """
    if log_text != "auto":
        return log_text == "true"
    return uri.startswith(("sqlite:", "file:")) or "://" not in uri


def sqlite_path(uri: str) -> Path | None:
    """The database file of a sqlite:/// URI, else None.

    >>> sqlite_path("sqlite:////repo/mlflow.db")
    PosixPath('/repo/mlflow.db')
    >>> sqlite_path("http://mlflow:5000") is None
    True
    """
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def artifact_location(uri: str, experiment: str) -> str | None:
    """Where a new experiment's artifacts go: beside a SQLite store, <its folder>/mlruns/<name>.

    MLflow's default is ./mlruns of the process that creates the experiment, which under
    `dvc exp run --queue` is DVC's temporary copy of the workspace, deleted after the run:
    every later run's artifacts (model, reports) would point into a folder that is gone.
    Other stores (a tracking server) choose for themselves: None.

    >>> artifact_location("sqlite:////repo/mlflow.db", "rarelm")
    '/repo/mlruns/rarelm'
    >>> artifact_location("http://mlflow:5000", "rarelm") is None
    True
    """
    db = sqlite_path(uri)
    return None if db is None else str(db.parent / "mlruns" / experiment_folder(experiment))


def experiment_folder(name: str) -> str:
    """The folder under mlruns/ for the experiment `name`: its letters (any script), digits, `.`,
    `-` and `_`, every other character `_`, leading dots `_` (never `..`, which put the artifacts
    at the repository's root and logged models under models/, nor a hidden folder), at most 100
    bytes. The experiment keeps its name in MLflow; runs sharing a folder keep theirs apart.

    >>> [experiment_folder(name) for name in ("rarelm", "..", ".hidden", "a/b c", "术语")]
    ['rarelm', '__', '_hidden', 'a_b_c', '术语']
    """
    safe = re.sub(r"[^\w.-]", "_", name)
    safe = re.sub(r"^\.+", lambda dots: "_" * len(dots.group()), safe)
    return safe.encode("utf-8")[:100].decode("utf-8", "ignore") or "_"
