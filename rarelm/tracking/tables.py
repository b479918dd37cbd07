"""Rows as an MLflow table: the UI shows it in the run's artifacts.

    write_table(client, run_id, [{"term": "x", "correct": 1}], "eval/occurrences.json")
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

TABLE_ROWS = 10_000  # term samples shown as a table in the UI; the full file is an artifact too


def write_table(client, run_id: str, rows: list[dict], artifact_file: str) -> None:
    """Log the first TABLE_ROWS `rows` as table `artifact_file`, replacing any earlier one.

    MlflowClient.log_table appends to an existing table, so an evaluation re-run
    into the same run would double its rows; this writes the same format instead.
    """
    import pandas as pd  # ~0.5 s, with mlflow: only once a table is logged
    from mlflow.utils.mlflow_tags import MLFLOW_LOGGED_ARTIFACTS

    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / Path(artifact_file).name
        pd.DataFrame(rows[:TABLE_ROWS]).to_json(local, orient="split", index=False)
        client.log_artifact(run_id, str(local), artifact_path=str(Path(artifact_file).parent))
    tag = json.loads(client.get_run(run_id).data.tags.get(MLFLOW_LOGGED_ARTIFACTS, "[]"))
    if {"path": artifact_file, "type": "table"} not in tag:
        tag.append({"path": artifact_file, "type": "table"})
        client.set_tag(run_id, MLFLOW_LOGGED_ARTIFACTS, json.dumps(tag))
