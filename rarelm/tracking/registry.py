"""The MLflow model registry: a version only when asked, and an alias that marks the good one.

Training logs its model with every run, but registers it only with `tracking.register: true`.
Otherwise a person picks a run and registers it, then moves the `champion` alias by hand:

    rarelm register                      # the run of models/model (the workspace's model)
    rarelm register exp-alpha07          # a DVC experiment's run (its name, a run name or a run id)
    rarelm register exp-alpha07 --champion
    rarelm champion 3                    # models:/rarelm@champion -> version 3 (a roll-back too)
    rarelm compare A B --baseline C --register   # the comparison's winner (rarelm/report/winner.py)

Each version carries a description (experiment, commit, data digests, headline metrics) and
tags (`experiment`, `git_commit`, the `summary/` metrics); nothing but `rarelm champion` or
`--champion` moves the alias, so `models:/rarelm@champion` serves what a person chose.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from rarelm import paths
from rarelm.errors import RarelmError
from rarelm.params import load_params
from rarelm.tracking.uri import tracking_uri

CHAMPION = "champion"
RUN_FILE = f"{paths.MODEL}/{paths.MLFLOW_RUN}"


def open_registry(params_file: str | Path, uri: str | None = None):
    """(client, params): a client of the store (`uri`, else the one `train` logs into) and the params
    that name the registered model; a one-line error for an unnamed model or a store that is not there."""
    params = load_params(params_file)
    if not params.tracking.registered_model:
        raise RarelmError("params: tracking.registered_model is empty: name the registered model")
    uri = uri or tracking_uri()
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        raise RarelmError(f"no MLflow store at {uri} (train with tracking on first, or set "
                          "MLFLOW_TRACKING_URI)")  # MlflowClient would create an empty one
    import mlflow  # ~2 s: only when the registry is used

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    return mlflow.MlflowClient(uri), params


def find_run(client, experiment: str, ref: str = "", run_file: str | Path = RUN_FILE):
    """The MLflow run `ref` names: a run id, a DVC experiment name, a run name; "" = the run file's."""
    if not ref:
        path = Path(run_file)
        if not path.is_file():
            raise RarelmError(f"{path}: no such run file (train with tracking on, or name a run)")
        ref = json.loads(path.read_text(encoding="utf-8"))["run_id"]
    if "'" in ref:
        raise RarelmError(f"run {ref!r} is not allowed (run ids and names have no quote)")
    found = client.get_experiment_by_name(experiment)
    if found is not None:
        for query in (f"attributes.run_id = '{ref}'", f"tags.DVC_EXP_NAME = '{ref}'",
                      f"attributes.run_name = '{ref}'"):
            runs = client.search_runs([found.experiment_id], query, order_by=["attributes.start_time DESC"],
                                      max_results=1)
            if runs:
                return runs[0]
    raise RarelmError(f"no run {ref!r} in MLflow experiment {experiment!r} (a run id, a DVC experiment "
                      "name or a run name)")


def logged_model_id(run) -> str:
    """The model the run logged (its Models column); the newest if several."""
    outputs = run.outputs.model_outputs if run.outputs else []
    if not outputs:
        raise RarelmError(f"run {run.info.run_id} ({run.info.run_name}) logged no model "
                          "(tracking.log_model was false, or the model was too large for auto)")
    return outputs[-1].model_id


def description(run, chosen: str = "") -> str:
    """The version's description: what a person needs to choose it, in a few lines (and `chosen`:
    how a comparison chose it, for a winner registered by `rarelm compare/headline --register`)."""
    tags, metrics = run.data.tags, run.data.metrics
    lines = [f"experiment: {tags.get('DVC_EXP_NAME') or run.info.run_name}",
             f"commit: {tags.get('git_commit', '') or 'unknown'}", f"run: {run.info.run_id}"]
    inputs = run.inputs.dataset_inputs if run.inputs else []
    lines += [f"data: {d.dataset.name} md5 {d.dataset.digest}" for d in inputs]
    headline = summary_metrics(metrics)
    lines.append("metrics: " + (", ".join(f"{k.removeprefix('summary/')} {v:.4g}"
                                          for k, v in headline.items()) or "none (not evaluated)"))
    if chosen:
        lines.append(f"chosen: {chosen}")
    return "\n".join(lines)


def summary_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The run's `summary/` metrics, in name order."""
    return {k: metrics[k] for k in sorted(metrics) if k.startswith("summary/")}


def register(client, name: str, run_id: str, champion: bool = False, chosen: str = "") -> str:
    """A new version of registered model `name` from the model that run `run_id` logged (`chosen`:
    a line for the description, how a comparison chose it)."""
    from mlflow.exceptions import MlflowException  # mlflow (~2 s): only when a model is registered

    run = client.get_run(run_id)
    model_id = logged_model_id(run)
    try:
        client.create_registered_model(name, description="rarelm causal LMs; the alias `champion` "
                                       "marks the one to serve (`rarelm champion VERSION` moves it)")
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":  # else: made earlier or by a parallel run
            raise
    tags = {"experiment": run.data.tags.get("DVC_EXP_NAME") or run.info.run_name or "",
            "git_commit": run.data.tags.get("git_commit", "")}
    tags |= {k: f"{v:.6g}" for k, v in summary_metrics(run.data.metrics).items()}
    version = client.create_model_version(name, source=f"models:/{model_id}", run_id=run_id,
                                          model_id=model_id, description=description(run, chosen),
                                          tags={k: v for k, v in tags.items() if v}).version
    if champion:
        set_champion(client, name, version)
    return str(version)


def set_champion(client, name: str, version: str) -> None:
    """Point the `champion` alias of `name` at `version` (which must exist)."""
    from mlflow.exceptions import MlflowException  # mlflow (~2 s): only when a model is registered

    try:
        client.get_model_version(name, str(version))
    except MlflowException:
        raise RarelmError(f"registered model {name!r} has no version {version}") from None
    client.set_registered_model_alias(name, CHAMPION, str(version))
