"""Stage `check`: params.yaml and what it names, checked before any stage can lose its outputs.

    python -m stages.check          # what dvc.yaml runs first
    rarelm check --params my.yaml   # the same by hand

DVC deletes a stage's outputs before running it: a stage that then refuses a param has lost its
previous outputs (a trained model). Every stage of dvc.yaml descends from this one, so a bad
params.yaml stops `dvc repro` here, in seconds, with one line naming the key, and every output
stays. The checks are in rarelm/check.py.

Writes data/checked.txt, whose text never changes: its hash, a dep of prepare, stays the same, so
a passing check re-runs nothing after it. dvc.yaml marks it `persist`: DVC leaves it in place
while the check runs, and a failing check deletes nothing at all.
"""

from pathlib import Path

import typer

from rarelm import paths
from rarelm.check import run, summary
from rarelm.errors import user_errors
from rarelm.params import load_params

app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def check(
    params_file: Path = typer.Option(paths.PARAMS, "--params", help="params.yaml to read"),
    out: Path = typer.Option(paths.CHECKED, help="the marker file a passing check leaves"),
) -> None:
    """Check every param, the corpus, the model and tokenizer, and the block sizes; touch nothing else."""
    with user_errors("check"):
        checked = run(load_params(params_file), out)
    print(summary(params_file, checked), flush=True)


if __name__ == "__main__":
    app()
