"""One MLflow run per trained model, shared by `train` and `evaluate`.

`train` starts the run and leaves its id beside the model; `evaluate` re-opens it from there:

    run = start_run(params, stage="train", inputs=["data/tokenized"])  # inert if tracking is off
    run.log_metrics({"train/loss": 2.5}, step=10)
    run.save("models/model/mlflow_run.json")
    run.log_model("models/model", params.tracking)  # a pyfunc (serving.py)
    run.finish()                                    # or run.finish("FAILED")

    run = open_run("models/model/mlflow_run.json", "evaluate", params)  # the store this process logs to
    run.log_metrics({"summary/ppl": 12.3})
    run.finish()

The run file is JSON: {"run_id": ..., "tracking_uri": ..., "experiment": ...}.

A run that cannot log fails the stage (`Run.require()`: one error line, exit 2,
before any output is written) unless `tracking.required: false`; then one warning
line goes to stderr and the Run turns inert.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rarelm.errors import RarelmError
from rarelm.files import write_json
from rarelm.process import sigterm_deferred
from rarelm.tracking import model_log
from rarelm.tracking.datasets import dataset_inputs
from rarelm.tracking.experiment import ensure_experiment
from rarelm.tracking.naming import committed_params, param_str, run_note, run_tags
from rarelm.tracking.redaction import reason, redact
from rarelm.tracking.store import prepare_store
from rarelm.tracking.tables import write_table
from rarelm.tracking.uri import repo_root, run_file_uri, set_http_defaults, tracking_uri


class Run:
    """One MLflow run seen through a client; every call is a no-op once it is inert."""

    def __init__(self, stage: str, uri: str, experiment: str, run_id: str | None = None,
                 system_metrics: bool = False, required: bool = False):
        self.stage, self.tracking_uri, self.experiment = stage, uri, experiment
        self.run_id = run_id
        self.system_metrics = system_metrics
        self.required = required  # tracking.required: a store that fails is an error, not a warning
        self.error: BaseException | None = None  # why the run turned inert
        self._tensorboard = None  # a SummaryWriter under runs/<run name>/ (tracking.tensorboard)
        self._client = None
        self._monitor = None
        self._thread = None  # connecting in the background (start_run(background=True))
        self._ended = False  # finish() ran
        # a training resumed: the last step each metric was logged at before the crash; steps up to
        # it are not logged again (it resumes at its last checkpoint and repeats the rows after it)
        self._logged_through: dict[str, int] = {}

    def _join(self) -> None:
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
            self._thread = None

    @property
    def active(self) -> bool:
        self._join()
        return self._client is not None and self.run_id is not None

    def _fail(self, exc: BaseException) -> None:
        """Turn inert; print the one warning line, or keep the error for require()."""
        if self.error is None:
            self.error = exc
            if not self.required:
                print(f"rarelm {self.stage}: warning: MLflow tracking store {redact(self.tracking_uri)} "
                      f"is not reachable ({reason(exc)}); going on without tracking",
                      file=sys.stderr, flush=True)
        self._stop_monitor()
        self._client = None

    def require(self) -> None:
        """Raise the one-line error if the run could not log and `tracking.required` is on."""
        self._join()
        if self.required and self.error is not None:
            raise RarelmError(f"MLflow tracking store {redact(self.tracking_uri)} cannot log "
                              f"({reason(self.error)}); fix it, or set tracking.required: false "
                              "to go on without tracking")

    def _note(self, what: str, exc: BaseException) -> None:
        """One warning line for a part that failed while the store answers; the run goes on."""
        print(f"rarelm {self.stage}: warning: {what} not logged to MLflow ({reason(exc)})",
              file=sys.stderr, flush=True)

    def _connect(self, params_flat: dict[str, Any] | None, tags: dict[str, str],
                 resume: bool, inputs: tuple[tuple[list, str], ...] = (), repeats: bool = False) -> None:
        """Open the store, resume or create the run, log params and tags; raises if the store fails.

        `repeats`: the resumed run repeats steps it logged before (a training resumed at its last
        checkpoint): a metric is not logged again at a step up to its last logged one. (An
        evaluation logging into the training run may log its keys again: the newest value shows.)
        """
        set_http_defaults()
        import mlflow  # ~2 s: only once a run connects (a stage's --help and param checks stay fast)
        from mlflow.entities import Param, RunTag

        logging.getLogger("mlflow").setLevel(logging.WARNING)  # no INFO chatter on stderr
        # a failed SQL statement (a read-only store) is logged there with its traceback (~90 lines)
        # before it is raised again: the one line of _fail or require() says it
        logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
        # system metrics are best effort: a store locked for a moment is not worth its ~6 lines of SQL
        logging.getLogger("mlflow.system_metrics").setLevel(logging.ERROR)
        prepare_store(self.tracking_uri, self.stage)
        client = mlflow.MlflowClient(self.tracking_uri)
        if resume:
            client.update_run(self.run_id, status="RUNNING")
            if repeats:
                self._logged_through = {
                    key: max(m.step for m in client.get_metric_history(self.run_id, key))
                    for key in client.get_run(self.run_id).data.metrics if not key.startswith("system/")}
        else:
            experiment_id = ensure_experiment(client, self.experiment, self.tracking_uri)
            run = client.create_run(experiment_id, run_name=tags.get("mlflow.runName") or None)
            self.run_id = run.info.run_id
        params = [Param(k, param_str(v)) for k, v in (params_flat or {}).items()]
        client.log_batch(self.run_id, params=params,
                         tags=[RunTag(k, v) for k, v in tags.items() if v and k != "mlflow.runName"])
        self._client = client
        for paths, context in inputs:
            self.log_datasets(paths, context)
        if self.system_metrics:
            self._start_monitor(resume)

    def _start_monitor(self, resume: bool) -> None:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor  # with mlflow

        self._monitor = SystemMetricsMonitor(self.run_id, resume_logging=resume,
                                             tracking_uri=self.tracking_uri)
        self._monitor.start()

    def _stop_monitor(self) -> None:
        if self._monitor is not None:
            monitor, self._monitor = self._monitor, None
            try:
                monitor.finish()
            except Exception:  # noqa: BLE001 - the monitor's own thread may already be gone
                pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if self._tensorboard is not None and step is not None:  # the step curves, tracked or not
            for key, value in metrics.items():
                if key.startswith(("train/", "val/")):
                    self._tensorboard.add_scalar(key, value, step)
        if not self.active:
            return
        metrics = {k: v for k, v in metrics.items() if (step or 0) > self._logged_through.get(k, -1)}
        if not metrics:
            return
        from mlflow.entities import Metric  # mlflow stays out of module import (~2 s); loaded by now

        now = int(time.time() * 1000)
        try:
            with sigterm_deferred():  # a SystemExit mid-write would keep the store locked
                self._client.log_batch(self.run_id, metrics=[
                    Metric(k, float(v), now, step or 0) for k, v in metrics.items()])
        except Exception as exc:  # tracking must never stop training
            self._fail(exc)

    def log_json(self, data: dict, artifact_file: str) -> None:
        """A dict as a JSON artifact of the run (counts and constants: not metrics)."""
        if not self.active or not data:
            return
        try:
            self._client.log_dict(self.run_id, data, artifact_file)
        except Exception as exc:
            self._note(artifact_file, exc)

    def set_tags(self, tags: dict[str, str]) -> None:
        if not self.active:
            return
        try:
            with sigterm_deferred():
                for key, value in tags.items():
                    self._client.set_tag(self.run_id, key, value)
        except Exception as exc:
            self._fail(exc)

    def log_datasets(self, paths: list[str | Path], context: str) -> None:
        """Log the paths dvc.lock (in the current folder) knows as MLflow dataset inputs
        (rarelm.tracking.datasets): the runs table's Dataset column."""
        if not self.active:
            return
        try:
            datasets = dataset_inputs(paths, context)
            if datasets:
                with sigterm_deferred():
                    self._client.log_inputs(self.run_id, datasets=datasets)
        except Exception as exc:
            self._note("datasets", exc)

    def log_table(self, rows: list[dict], artifact_file: str) -> None:
        """Rows as an MLflow table (the UI shows it in the run's artifacts), replacing any earlier one."""
        if not self.active or not rows:
            return
        try:
            write_table(self._client, self.run_id, rows, artifact_file)
        except Exception as exc:
            self._note(f"table {artifact_file}", exc)

    def log_model(self, model_dir: str | Path, tracking) -> str | None:
        """Log a saved causal LM folder (model + tokenizer + model card) as a text-generation model.

        `tracking` is params.tracking: `log_model` auto (weights under 2 GB) / true /
        false; with `register` true also a new version of `registered_model` (see
        rarelm.tracking.registry for registering later, by command). Returns the model's URI
        (`models:/<name>/<version>` when registered), or None. A failure is one warning
        line; the run goes on. The MLflow model is rarelm/tracking/serving.py (a pyfunc) with
        the folder as its artifact "model"; serve it with
        `mlflow models serve -m models:/rarelm@champion --env-manager local`.
        """
        model_dir = Path(model_dir).resolve()  # a path, not a hub id: MLflow looks nothing up online
        if not self.active or not model_log.wanted(model_dir, tracking):
            return None
        t0 = time.perf_counter()
        try:
            uri = model_log.log_model(self._client, self.run_id, self.tracking_uri, model_dir, tracking)
        except Exception as exc:  # the flavour or the registry failed: a note, not a failed run
            self._note("model", exc)
            return None
        print(f"rarelm {self.stage}: model logged to MLflow as {uri} "
              f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
        return uri

    def save(self, path: str | Path) -> None:
        """Write the run file (run_id, run_file_uri(tracking_uri), experiment); nothing if inert."""
        if self.active:
            write_json(path, {"run_id": self.run_id, "tracking_uri": run_file_uri(self.tracking_uri),
                              "experiment": self.experiment})

    def finish(self, status: str = "FINISHED") -> None:
        """End the run as FINISHED, FAILED or KILLED; the Run is inert afterwards.

        A run that turned inert midway (a SQLite store locked past MLflow's 20 s busy timeout on a
        loaded machine) is still ended, through a fresh client and up to three tries: the UI does
        not show it RUNNING for ever."""
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        self._join()
        if self.run_id is None or self._ended or (self._client is None and self.error is None):
            return  # never connected, or already ended
        self._stop_monitor()
        client, self._client = self._client, None
        for attempt in range(3):
            try:
                if client is None:
                    import mlflow  # loaded by _connect already
                    client = mlflow.MlflowClient(self.tracking_uri)
                with sigterm_deferred():
                    client.set_terminated(self.run_id, status)
                break
            except Exception as exc:  # noqa: BLE001 - the store's own error, said once by _fail
                self._fail(exc)
                client = None
                if attempt < 2:
                    time.sleep(attempt + 1)
        self._ended = True


def check_tensorboard(tracking) -> None:
    """A one-line error when `tracking.tensorboard` is on and the tensorboard package is not."""
    if tracking.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise RarelmError("params: tracking.tensorboard = true needs the tensorboard package "
                          "(pip install -e '.[tensorboard]'), or set it to false")


def start_run(params, stage: str, run_id: str | None = None, background: bool = False,
              inputs: list[str | Path] = ()) -> Run:
    """Start a run for `params` (a rarelm.params.Params), or resume `run_id` if given.

    Logs every param flattened, the tags of rarelm.tracking.naming.run_tags and `inputs`
    as "training" datasets; starts MLflow's system-metrics thread when
    `params.tracking.system_metrics` is on, a TensorBoard writer when
    `params.tracking.tensorboard` is. Never raises for the store: an unreachable one
    gives an inert Run and one warning line. With `background`, connecting (seconds:
    `import mlflow`, the SQLite store's schema check) overlaps with the caller's work;
    the Run's first use waits for it.
    """
    run = Run(stage, tracking_uri(), params.tracking.experiment, run_id,
              system_metrics=params.tracking.system_metrics, required=params.tracking.required)
    tags = run_tags(stage, params)
    if run_id is None:
        tags["mlflow.note.content"] = run_note(params, tags, committed_params(tags["git_commit"]))
    if params.tracking.tensorboard:
        run._tensorboard = _tensorboard_writer(params.tracking, stage, tags["mlflow.runName"])
    datasets = ((list(inputs), "training"),) if inputs else ()

    def connect() -> None:
        try:
            run._connect(params.flat(), dict(tags), resume=run_id is not None, inputs=datasets,
                         repeats=run_id is not None)
            return
        except Exception as exc:  # unreachable store, bad URI, read-only file, run deleted...
            error = exc
        if run_id is not None:  # the run to resume is gone (store wiped?): start a new one
            run.run_id = None
            try:
                run._connect(params.flat(), dict(tags), resume=False, inputs=datasets)
                return
            except Exception as exc:
                error = exc
        run.run_id = None
        run._fail(error)

    if background:
        run._thread = threading.Thread(target=connect, name="mlflow-connect", daemon=True)
        run._thread.start()
    else:
        with sigterm_deferred():  # creating the run writes to the store
            connect()
    return run


def _tensorboard_writer(tracking, stage: str, name: str):
    """A SummaryWriter under runs/<run name>/ (else runs/<stage>-<time>/)."""
    check_tensorboard(tracking)
    from torch.utils.tensorboard import SummaryWriter  # an optional package (tracking.tensorboard)

    return SummaryWriter(str(repo_root() / "runs" / (name or time.strftime(f"{stage}-%Y%m%d-%H%M%S"))))


def open_run(run_file: str | Path, stage: str, params) -> Run:
    """The run an evaluation logs into, in the store MLFLOW_TRACKING_URI names (else the repo's).

    That is the run that trained the model, named in its run file (written by Run.save),
    when the file names this same store, the run is there and belongs to this DVC
    experiment; it is set RUNNING again. Otherwise (no run file, a model tracked in
    another store, a store without that run, a model that DVC's run cache restored from
    another experiment) a new run in `params.tracking.experiment`, with every param and
    the tag `rarelm.model_run_id` when the file names one. Call finish() when done.
    """
    uri = tracking_uri()
    path = Path(run_file)
    info = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    run = Run(stage, uri, params.tracking.experiment, None, required=params.tracking.required)
    if info.get("tracking_uri") == run_file_uri(uri) and info.get("run_id"):
        try:
            run.run_id, run.experiment = info["run_id"], info.get("experiment") or run.experiment
            if not _model_of_another_experiment(uri, info["run_id"]):
                run._connect(None, {}, resume=True)
                stages = run._client.get_run(run.run_id).data.tags.get("stages", "")
                run.set_tags({"stages": ",".join(filter(None, [stages, stage]))})
                return run
        except Exception:  # noqa: BLE001 - not in this store (or none): a run of its own below
            pass
    run.run_id, run.experiment = None, params.tracking.experiment
    model_run = {"rarelm.model_run_id": info["run_id"]} if info.get("run_id") else {}
    try:
        run._connect(params.flat(), run_tags(stage, params) | model_run, resume=False)
    except Exception as exc:
        run.run_id = None
        run._fail(exc)
    return run


def _model_of_another_experiment(uri: str, run_id: str) -> bool:
    """Whether this `dvc exp run` re-uses a model trained by another run (DVC's run cache restored it).

    A DVC experiment that changes only `evaluate`'s params (say `eval.logit_adjust_tau`) gets the
    trained model of the experiment that trained it; logging into that run would overwrite its
    evaluation, so such an evaluation gets a run of its own, tagged `rarelm.model_run_id`.
    """
    name = os.environ.get("DVC_EXP_NAME", "")
    if not name:
        return False
    import mlflow  # ~2 s: only under `dvc exp run`, once a run connects

    prepare_store(uri, "evaluate")
    tags = mlflow.MlflowClient(uri).get_run(run_id).data.tags
    return tags.get("DVC_EXP_NAME", "") != name
