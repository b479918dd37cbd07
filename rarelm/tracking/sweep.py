"""A sweep as one parent MLflow run over its experiments' runs, its report folder as artifacts.

    log_sweep("rarelm", "headline-2c46d84", ["base-s1", "alpha07-s1"], "reports/headline/final")
"""

from __future__ import annotations

import sys
from pathlib import Path

from rarelm.tracking.experiment import experiment_id
from rarelm.tracking.naming import git_commit
from rarelm.tracking.uri import tracking_uri


def log_sweep(experiment: str, name: str, children: list[str], report_dir: str | Path,
              note: str = "", uri: str | None = None) -> str | None:
    """A parent run `name` for a sweep: the runs of DVC experiments `children` become its children
    (tag mlflow.parentRunId, so the runs table nests them), the report folder its artifacts.

    Done after the sweep, from the runs' DVC_EXP_NAME tags, so the sweep's experiments need
    to know nothing of it. Returns the parent's run id; None (one warning line) if the store
    has no such experiment or cannot be reached: a sweep's results stand without it.
    """
    uri = uri or tracking_uri()
    if experiment_id(uri, experiment) is None:
        return None
    try:
        import mlflow  # ~2 s: only when a sweep is logged

        client = mlflow.MlflowClient(uri)
        found = client.get_experiment_by_name(experiment)
        runs = [r for r in client.search_runs([found.experiment_id], max_results=5000)
                if r.data.tags.get("DVC_EXP_NAME") in set(children)]
        parent = client.create_run(found.experiment_id, run_name=name, tags={
            "mlflow.note.content": note or f"Sweep {name}: {len(runs)} runs; the comparison is "
            "in this run's artifacts (report.md, index.html).", "git_commit": git_commit(), "stage": "sweep"})
        for run in runs:
            client.set_tag(run.info.run_id, "mlflow.parentRunId", parent.info.run_id)
        if Path(report_dir).is_dir():
            client.log_artifacts(parent.info.run_id, str(report_dir))
        client.set_terminated(parent.info.run_id)
        return parent.info.run_id
    except Exception as exc:  # noqa: BLE001 - the sweep's files are written; MLflow is a view of them
        print(f"rarelm headline: warning: sweep not logged to MLflow ({type(exc).__name__}: "
              f"{' '.join(str(exc).split())[:200]})", file=sys.stderr, flush=True)
        return None
