"""The MLflow experiment that holds the runs: made once, tagged so the UI opens it as model training.

    >>> EXPERIMENT_KIND
    {'mlflow.experimentKind': 'custom_model_development'}
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

from rarelm.tracking.uri import artifact_location, sqlite_path

EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}  # the UI's "Model training"
EXPERIMENT_NOTE = (  # the experiment's description (mlflow.note.content), shown above its runs table
    "One run per trained model (rarelm: rare domain terms). Read the `summary/` metrics first: "
    "term NLL, term-token accuracy, term exact match (all terms, terms seen <= 15 times in train), "
    "em50 (train occurrences for 50% exact match), overall and frequent-bucket perplexity, training "
    "tokens/s. Step curves are under `train/` and `val/`. Every other figure is in a run's "
    "artifacts: `eval/eval.json` (the evaluation, every split), `final/train.json` (training), "
    "`upstream.json` (the earlier stages); settings are params and tags. Register a run's model "
    "with `rarelm register RUN` (or the winner: `rarelm compare ... --register`); "
    "`models:/rarelm@champion` is the one chosen to serve (`rarelm champion VERSION`).")


def ensure_experiment(client, name: str, uri: str) -> str:
    """The id of experiment `name`, created (artifacts beside a SQLite store) if there is none.

    An experiment from before the tags gets them; one that a parallel run created meanwhile
    is used as it is.
    """
    from mlflow.exceptions import MlflowException  # mlflow (~2 s) only once a run connects

    tags = EXPERIMENT_KIND | {"mlflow.note.content": EXPERIMENT_NOTE}
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        for key, value in tags.items():
            if key not in experiment.tags:  # a store from before the tag
                client.set_experiment_tag(experiment.experiment_id, key, value)
        return experiment.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location(uri, name), tags=tags)
    except MlflowException:  # created meanwhile by a parallel run?
        experiment = client.get_experiment_by_name(name)
        if experiment is None:  # no: the store refused (read-only, ...)
            raise
        return experiment.experiment_id


def experiment_id(uri: str, name: str) -> str | None:
    """The id of experiment `name` in the store, or None (no such experiment, no store yet).

    A SQLite store is read with sqlite3 (instant; `import mlflow` costs seconds) and
    never created.
    """
    db = sqlite_path(uri)
    if db is not None:
        return _sqlite_experiment_id(db, name)
    try:
        import mlflow  # ~2 s: only for a store that is not a SQLite file

        experiment = mlflow.MlflowClient(uri).get_experiment_by_name(name)
    except Exception:  # noqa: BLE001 - without an id the link opens the experiments list
        return None
    return experiment.experiment_id if experiment else None


def _sqlite_experiment_id(db: Path, name: str) -> str | None:
    if not db.is_file():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as con:
            row = con.execute("SELECT experiment_id FROM experiments WHERE name = ? "
                              "AND lifecycle_stage = 'active'", (name,)).fetchone()
    except sqlite3.Error:
        return None
    return str(row[0]) if row else None
