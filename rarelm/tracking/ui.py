"""The MLflow UI's link to the runs, in its model-training (not GenAI) view: `make ui` prints it.

    python -m rarelm.tracking ui-url [TRACKING_URI]
"""

from __future__ import annotations

import sys

from rarelm.errors import RarelmError
from rarelm.params import load_params
from rarelm.tracking.experiment import experiment_id
from rarelm.tracking.uri import tracking_uri

UI = "http://127.0.0.1:5000"  # where `make ui` serves the store


def ui_url(experiment_id: str | None, base: str = UI) -> str:
    """The MLflow UI's page for an experiment's runs, in its model-training (not GenAI) view.

    >>> ui_url("1")
    'http://127.0.0.1:5000/#/experiments/1?workflowType=machine_learning'
    """
    page = f"experiments/{experiment_id}" if experiment_id else "experiments"
    return f"{base}/#/{page}?workflowType=machine_learning"


def main(argv: list[str]) -> int:
    """`python -m rarelm.tracking ui-url [STORE]`: print the UI's link to the runs (`make ui`)."""
    if len(argv) not in (1, 2) or argv[0] != "ui-url":
        print("usage: python -m rarelm.tracking ui-url [TRACKING_URI]", file=sys.stderr)
        return 2
    try:
        name = load_params("params.yaml").tracking.experiment
    except RarelmError:
        name = "rarelm"
    uri = argv[1] if len(argv) == 2 else tracking_uri()
    print(f"MLflow runs: {ui_url(experiment_id(uri, name))}", flush=True)
    return 0
