"""The trained model as an MLflow model: a text-generation pyfunc (serving.py) over the folder.

`tracking.log_model` auto logs models with fewer than MODEL_LOG_LIMIT bytes of weights;
the model is called with a list of prompts and SERVING_DEFAULTS' generation settings:

    >>> INPUT_EXAMPLE[0], sorted(INPUT_EXAMPLE[1])[:3]
    (['The patient was'], ['do_sample', 'max_new_tokens', 'seed'])
"""

from __future__ import annotations

import contextlib
import logging
from importlib.metadata import version
from pathlib import Path

from rarelm.tracking.registry import register

MODEL_LOG_LIMIT = 2 * 1024**3  # tracking.log_model: auto logs models with fewer bytes of weights
# what the MLflow model is called with: serving.py's params and defaults
SERVING_DEFAULTS = {"max_new_tokens": 32, "do_sample": True, "temperature": 0.8, "top_k": 50,
                    "top_p": 0.95, "seed": 0}
INPUT_EXAMPLE = (["The patient was"], SERVING_DEFAULTS)  # shown in the UI, checked at logging
SERVING = Path(__file__).with_name("serving.py")  # the MLflow model's code, copied into the model


def wanted(model_dir: Path, tracking) -> bool:
    """Whether params.tracking asks to log this model: `log_model` true, or auto and not too large."""
    return tracking.log_model != "false" and \
        not (tracking.log_model == "auto" and weights_bytes(model_dir) >= MODEL_LOG_LIMIT)


def weights_bytes(model_dir: Path) -> int:
    return sum(f.stat().st_size for f in model_dir.iterdir()
               if f.suffix in (".safetensors", ".bin", ".pt", ".pth"))


def log_model(client, run_id: str, uri: str, model_dir: Path, tracking) -> str:
    """Log `model_dir` into run `run_id` as the pyfunc "model"; registered too if params.tracking
    says `register`. Returns the model's URI (`models:/<name>/<version>` when registered)."""
    import mlflow  # ~2 s: only once a model is logged

    with _quiet("mlflow.models", "mlflow.pyfunc"):  # no notes on the input example's validation
        mlflow.set_tracking_uri(uri)  # Model.log's own client
        # and its experiment: MLflow files a logged model under the current fluent experiment
        # (else Default), not under its run's, and the run's Models column stays empty
        mlflow.set_experiment(experiment_id=client.get_run(run_id).info.experiment_id)
        # mlflow.pyfunc.log_model itself, but into this run (it logs into the active run only)
        info = mlflow.models.Model.log(
            artifact_path=None, name="model", flavor=mlflow.pyfunc, run_id=run_id,
            flavor_name="pyfunc.ModelFromCode", python_model=str(SERVING),
            artifacts={"model": str(model_dir)}, signature=_generation_signature(),
            input_example=INPUT_EXAMPLE, pip_requirements=_requirements())
        if tracking.register and tracking.registered_model:
            number = register(client, tracking.registered_model, run_id)
            return f"models:/{tracking.registered_model}/{number}"
        return info.model_uri


@contextlib.contextmanager
def _quiet(*names: str):
    """Only errors from the loggers `names` inside the block."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    try:
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _generation_signature():
    """str in, str out, with generation settings a request may pass (`params`, defaults those of
    `rarelm generate`: serving.DEFAULTS)."""
    from mlflow.models import ModelSignature  # mlflow (~2 s): only once a model is logged
    from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema

    types = {int: "long", bool: "boolean", float: "double"}
    return ModelSignature(Schema([ColSpec("string")]), Schema([ColSpec("string")]), params=ParamSchema([
        ParamSpec(name, types[type(value)], value) for name, value in SERVING_DEFAULTS.items()]))


def _requirements() -> list[str]:
    """Pinned to what is installed here, so MLflow need not infer them (a subprocess, ~10 s)."""
    return [f"{name}=={version(name).split('+')[0]}"  # torch 2.13.0+cpu -> torch==2.13.0
            for name in ("mlflow", "transformers", "tokenizers", "torch", "safetensors")]
