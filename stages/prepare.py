"""Stage `prepare`: raw corpus -> cleaned train/val/test documents.

    python -m stages.prepare            # as dvc.yaml runs it
    rarelm prepare --params my.yaml     # the same through the console script

Writes data/prepared/{train,val,test}.jsonl and stats.json (also as metrics/prepare.json).
"""

from pathlib import Path

import typer

from rarelm import paths
from rarelm.errors import user_errors
from rarelm.params import load_params
from rarelm.prepare.stage import run, summary

app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def prepare(
    params_file: Path = typer.Option(paths.PARAMS, "--params", help="params.yaml to read"),
    out: Path = typer.Option(paths.PREPARED, help="output folder"),
    metrics: Path = typer.Option(paths.PREPARE_METRICS, help="stats file"),
) -> None:
    """Clean the corpus and split it by document into train/val/test."""
    with user_errors("prepare"):
        params = load_params(params_file, hold=True)  # outputs refused if it changes meanwhile
        stats = run(params, out, metrics)
    print(summary(stats))


if __name__ == "__main__":
    app()
