"""`rarelm register` and `rarelm champion`: the MLflow model registry, by hand (rarelm/tracking/registry.py).

    rarelm register                        # the run that trained models/model
    rarelm register exp-alpha07 --champion # a DVC experiment's run, and make it the champion
    rarelm champion 2                      # models:/rarelm@champion -> version 2 (roll back, too)

Not DVC stages: the registry records a person's choice. The registry name is
params.yaml's `tracking.registered_model`, the store the one `train` logs into.
"""

from pathlib import Path

import typer

from rarelm import paths
from rarelm.errors import user_errors
from rarelm.tracking import registry


def register(
    run: str = typer.Argument("", help="run id, DVC experiment name or run name ('' = models/model's run)"),
    champion: bool = typer.Option(False, "--champion", help="also point the alias `champion` at it"),
    params_file: Path = typer.Option(paths.PARAMS, "--params", help="params.yaml to read"),
) -> None:
    """Register the model a run logged as a new version, with a description and tags."""
    with user_errors("register"):

        client, params = registry.open_registry(params_file)
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

        client, params = registry.open_registry(params_file)
        name = params.tracking.registered_model
        registry.set_champion(client, name, str(version))
    print(f"champion: models:/{name}@{registry.CHAMPION} -> version {version}")
