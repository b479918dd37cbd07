"""`rarelm register` and `rarelm champion`: the MLflow model registry, by hand (rarelm/tracking/registry.py).

    rarelm register                        # the run that trained models/model
    rarelm register exp-alpha07 --champion # a DVC experiment's run, and make it the champion
    rarelm champion 2                      # models:/rarelm@champion -> version 2 (roll back, too)

Not DVC stages: the registry records a person's choice. The registry name is
params.yaml's `tracking.registered_model`, the store the one `train` logs into.
"""

import logging
from pathlib import Path

import typer

from rarelm import paths
from rarelm.errors import RarelmError, user_errors
from rarelm.params import load_params
from rarelm.tracking import registry
from rarelm.tracking.uri import tracking_uri


def _client_and_params(params_file: Path):
    params = load_params(params_file)
    if not params.tracking.registered_model:
        raise RarelmError("params: tracking.registered_model is empty: name the registered model")
    # on use: mlflow takes seconds to import, which every `rarelm` command would pay
    import mlflow

    uri = tracking_uri()
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        raise RarelmError(f"no MLflow store at {uri} (train with tracking on first, or set "
                          "MLFLOW_TRACKING_URI)")  # MlflowClient would create an empty one
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    return mlflow.MlflowClient(uri), params


def register(
    run: str = typer.Argument("", help="run id, DVC experiment name or run name ('' = models/model's run)"),
    champion: bool = typer.Option(False, "--champion", help="also point the alias `champion` at it"),
    params_file: Path = typer.Option(paths.PARAMS, "--params", help="params.yaml to read"),
) -> None:
    """Register the model a run logged as a new version, with a description and tags."""
    with user_errors("register"):

        client, params = _client_and_params(params_file)
        found = registry.find_run(client, params.tracking.experiment, run,
                                  Path(paths.MODEL) / paths.MLFLOW_RUN)
        name = params.tracking.registered_model
        version = registry.register(client, name, found.info.run_id, champion)
    alias = f", alias {registry.CHAMPION}" if champion else ""
    print(f"register: run {found.info.run_id} ({found.info.run_name}) -> models:/{name}/{version}{alias}")


def champion(
    version: int = typer.Argument(..., help="the registered version to serve as models:/<name>@champion"),
    params_file: Path = typer.Option(paths.PARAMS, "--params", help="params.yaml to read"),
) -> None:
    """Point the alias `champion` at VERSION (the only command that moves it)."""
    with user_errors("champion"):

        client, params = _client_and_params(params_file)
        name = params.tracking.registered_model
        registry.set_champion(client, name, str(version))
    print(f"champion: models:/{name}@{registry.CHAMPION} -> version {version}")
