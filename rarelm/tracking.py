"""MLflow tracking: one run per trained model, shared by `train` and `evaluate`.

The store is `$MLFLOW_TRACKING_URI`, or else the embedded SQLite store
`sqlite:///<repo root>/mlflow.db` where the repo root is `$DVC_ROOT` (set by DVC,
even inside the temporary copies that queued experiments run in) or the
current folder. `train` starts the run and leaves its id beside the model;
`evaluate` re-opens it from there:

    run = start_run(params, stage="train")        # a Run; inert if tracking is off
    run.log_metrics({"train/loss": 2.5}, step=10)
    run.save("models/model/mlflow_run.json")
    run.finish()                                  # or run.finish("FAILED")

    run = open_run("models/model/mlflow_run.json", stage="evaluate")
    run.log_metrics({"eval/ppl": 12.3})
    run.finish()

The run file is JSON: {"run_id": ..., "tracking_uri": ..., "experiment": ...}.

Tags on every run: `stage` (the stage that started it), `stages` (every stage
that logged into it, comma-separated: "train,evaluate"), `git_commit`,
`DVC_EXP_NAME` (only under `dvc exp run`; also the run name) and MLflow's own
`mlflow.source.git.commit`. Params: all of params.yaml, flattened (`train.lr`).

Tracking never stops a stage: if the store cannot be reached, or fails later,
one warning line goes to stderr and the Run turns inert. Network calls are
bounded (MLFLOW_HTTP_REQUEST_MAX_RETRIES / _TIMEOUT default to 1 retry and
5 s here unless set), so a down server costs seconds, not minutes.
`import mlflow` (~2 s) happens only when a run starts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rarelm.files import write_json

_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
                  "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                  "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}


def repo_root() -> Path:
    """$DVC_ROOT if set (the real workspace, even in an experiment's temp copy), else cwd."""
    return Path(os.environ.get("DVC_ROOT") or os.getcwd()).resolve()


def tracking_uri() -> str:
    """$MLFLOW_TRACKING_URI, else sqlite:///<repo root>/mlflow.db (absolute)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{repo_root() / 'mlflow.db'}"


def git_commit(cwd: Path | None = None) -> str:
    """The checked-out commit, or "" outside a git repo."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd or repo_root(),
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def flatten(data: Any, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of nested dicts as {"a.b": 1.0}; strings and lists are skipped.

    >>> flatten({"train": {"tokens": 10, "name": "x"}, "vocab": 5}, "tokenize.")
    {'tokenize.train.tokens': 10.0, 'tokenize.vocab': 5.0}
    """
    out: dict[str, float] = {}
    if isinstance(data, dict):
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}{key}."))
    elif isinstance(data, (int, float)) and not isinstance(data, bool):
        out[prefix.rstrip(".")] = float(data)
    return out


def upstream_metrics(metrics_dir: str | Path, stages: list[str]) -> dict[str, float]:
    """metrics/<stage>.json of every stage that has one, flattened as "<stage>.<key>"."""
    out: dict[str, float] = {}
    for stage in stages:
        path = Path(metrics_dir) / f"{stage}.json"
        if path.is_file():
            try:
                out.update(flatten(json.loads(path.read_text(encoding="utf-8")), f"{stage}."))
            except (OSError, ValueError):
                continue  # a broken metrics file is that stage's problem, not tracking's
    return out


class Run:
    """One MLflow run seen through a client; every call is a no-op once it is inert."""

    def __init__(self, stage: str, uri: str, experiment: str, run_id: str | None = None,
                 system_metrics: bool = False):
        self.stage, self.tracking_uri, self.experiment = stage, uri, experiment
        self.run_id = run_id
        self.system_metrics = system_metrics
        self._client = None
        self._monitor = None
        self._warned = False
        self._thread = None  # connecting in the background (start_run(background=True))

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    @property
    def active(self) -> bool:
        self._join()
        return self._client is not None and self.run_id is not None

    def _fail(self, exc: BaseException) -> None:
        """Print the one warning line and turn inert."""
        if not self._warned:
            self._warned = True
            reason = " ".join(str(exc).split())[:200]
            print(f"rarelm {self.stage}: warning: MLflow tracking store {self.tracking_uri} "
                  f"is not reachable ({type(exc).__name__}: {reason}); "
                  "going on without tracking", file=sys.stderr, flush=True)
        self._stop_monitor()
        self._client = None

    def _connect(self, params_flat: dict[str, Any] | None, tags: dict[str, str],
                 resume: bool) -> None:
        for key, value in _HTTP_DEFAULTS.items():
            os.environ.setdefault(key, value)
        import logging

        import mlflow
        from mlflow.entities import Param, RunTag

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # no INFO chatter on stderr
        client = mlflow.MlflowClient(self.tracking_uri)
        if resume:
            client.update_run(self.run_id, status="RUNNING")
        else:
            experiment = client.get_experiment_by_name(self.experiment)
            if experiment is None:
                try:
                    experiment_id = client.create_experiment(self.experiment)
                except mlflow.exceptions.MlflowException:  # created meanwhile by a parallel run
                    experiment_id = client.get_experiment_by_name(self.experiment).experiment_id
            else:
                experiment_id = experiment.experiment_id
            run = client.create_run(experiment_id, run_name=tags.get("DVC_EXP_NAME") or None)
            self.run_id = run.info.run_id
        params = [Param(k, _param_str(v)) for k, v in (params_flat or {}).items()]
        client.log_batch(self.run_id, params=params,
                         tags=[RunTag(k, v) for k, v in tags.items() if v])
        self._client = client
        if self.system_metrics:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            self._monitor = SystemMetricsMonitor(self.run_id, resume_logging=resume,
                                                 tracking_uri=self.tracking_uri)
            self._monitor.start()

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if not self.active or not metrics:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        try:
            self._client.log_batch(self.run_id, metrics=[
                Metric(k, float(v), now, step or 0) for k, v in metrics.items()])
        except Exception as exc:  # tracking must never stop training
            self._fail(exc)

    def set_tags(self, tags: dict[str, str]) -> None:
        if not self.active:
            return
        try:
            for key, value in tags.items():
                self._client.set_tag(self.run_id, key, value)
        except Exception as exc:
            self._fail(exc)

    def save(self, path: str | Path) -> None:
        """Write the run file (run_id, tracking_uri, experiment); nothing if inert."""
        if self.active:
            write_json(path, {"run_id": self.run_id, "tracking_uri": self.tracking_uri,
                              "experiment": self.experiment})

    def _stop_monitor(self) -> None:
        if self._monitor is not None:
            monitor, self._monitor = self._monitor, None
            try:
                monitor.finish()
            except Exception:  # noqa: BLE001 - the monitor's own thread may already be gone
                pass

    def finish(self, status: str = "FINISHED") -> None:
        """End the run as FINISHED, FAILED or KILLED; the Run is inert afterwards."""
        if not self.active:
            return
        self._stop_monitor()
        try:
            self._client.set_terminated(self.run_id, status)
        except Exception as exc:
            self._fail(exc)
        self._client = None


def _param_str(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def run_tags(stage: str) -> dict[str, str]:
    commit = git_commit()
    return {"stage": stage, "stages": stage, "git_commit": commit, "mlflow.source.git.commit": commit,
            "DVC_EXP_NAME": os.environ.get("DVC_EXP_NAME", "")}


def start_run(params, stage: str, run_id: str | None = None, background: bool = False) -> Run:
    """Start a run for `params` (a rarelm.params.Params), or resume `run_id` if given.

    Logs every param flattened and the tags above; starts MLflow's system-metrics
    thread when `params.tracking.system_metrics` is on. Never raises: an
    unreachable store gives an inert Run and one warning line. With `background`,
    connecting (seconds: `import mlflow`, the SQLite store's schema check) overlaps
    with the caller's work; the Run's first use waits for it.
    """
    import threading

    run = Run(stage, tracking_uri(), params.tracking.experiment, run_id,
              system_metrics=params.tracking.system_metrics)

    def connect() -> None:
        try:
            run._connect(params.flat(), run_tags(stage), resume=run_id is not None)
            return
        except Exception as exc:  # unreachable store, bad URI, read-only file, run deleted...
            error = exc
        if run_id is not None:  # the run to resume is gone (store wiped?): start a new one
            run.run_id = None
            try:
                run._connect(params.flat(), run_tags(stage), resume=False)
                return
            except Exception as exc:
                error = exc
        run.run_id = None
        run._fail(error)

    if background:
        run._thread = threading.Thread(target=connect, name="mlflow-connect", daemon=True)
        run._thread.start()
    else:
        connect()
    return run


def open_run(run_file: str | Path, stage: str, system_metrics: bool = False) -> Run:
    """Re-open the run named in a run file (written by Run.save) to log more into it.

    A missing run file (training ran without tracking) gives an inert Run.
    The run is set RUNNING again; call finish() when done.
    """
    path = Path(run_file)
    if not path.is_file():
        return Run(stage, tracking_uri(), "", None)
    info = json.loads(path.read_text(encoding="utf-8"))
    run = Run(stage, info["tracking_uri"], info.get("experiment", ""), info["run_id"],
              system_metrics=system_metrics)
    try:
        run._connect(None, {}, resume=True)
        stages = run._client.get_run(run.run_id).data.tags.get("stages", "")
        run.set_tags({"stages": ",".join(filter(None, [stages, stage]))})
    except Exception as exc:
        run._fail(exc)
    return run
