"""One Typer script per DVC stage; `python -m stages.<name>` is what dvc.yaml runs.

Each script reads params.yaml, calls the `rarelm` library, writes its outputs
atomically and prints a one-line summary. The default paths below are the DAG's
layout (dvc.yaml lists the same); options override them for use outside DVC.
"""

PARAMS = "params.yaml"
PREPARED = "data/prepared"
TOKENIZED = "data/tokenized"
RARE = "data/rare"
WEIGHTS = "data/weights"
MODEL = "models/model"
METRICS = "metrics"
PLOTS = "plots"
