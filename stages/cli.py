"""The `rarelm` console script: every stage as a subcommand, for use outside DVC.

    rarelm prepare && rarelm tokenize      # what `dvc repro` runs, by hand
    rarelm demo                            # rebuild the demo corpora under data/raw/
    rarelm generate "The patient" --model models/model   # continue a prompt, streaming
    rarelm compare exp-a exp-b --baseline HEAD --out reports   # paired intervals, HTML report
    rarelm headline                        # every remedy vs the baseline, queued DVC experiments (~90 min)
    rarelm run-plan --plan p.yaml --out d  # a fixed plan's experiments as processes, no DVC (a GPU machine)
    rarelm register exp-name --champion    # register a run's model in MLflow, mark it to serve
    rarelm champion 2                      # move the `champion` alias (roll back)
    rarelm release v1.0.0                  # git tag rarelm@v1.0.0: `dvc artifacts get . rarelm` finds it
    rarelm --version                       # the installed version (pyproject.toml's)
"""

from importlib.metadata import version
from pathlib import Path

import typer

from rarelm import paths
from rarelm.prepare import demo as demo_corpora
from stages.compare import compare
from stages.datastore import datastore
from stages.evaluate import evaluate
from stages.generate import generate
from stages.headline import headline
from stages.prepare import prepare
from stages.rare_terms import rare_terms
from stages.register import champion, register
from stages.release import release
from stages.run_plan import run_plan
from stages.tokenize import tokenize
from stages.train import train
from stages.weights import weights

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)


def _print_version(value: bool) -> None:
    if value:
        print(f"rarelm {version('rarelm')}")
        raise typer.Exit()


@app.callback()
def main(
    _version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                  help="print the installed version and exit"),
) -> None:
    """Every stage as a subcommand, for use outside DVC."""

app.command()(prepare)
app.command()(tokenize)
app.command(name="rare_terms")(rare_terms)
app.command()(weights)
app.command()(train)
app.command()(datastore)
app.command()(evaluate)
app.command()(generate)
app.command()(compare)
app.command()(headline)
app.command()(register)
app.command()(champion)
app.command()(release)
app.command(name="run-plan")(run_plan)


@app.command()
def demo(out: Path = typer.Option(paths.RAW, help="output folder")) -> None:
    """Rebuild the demo corpora and their glossaries, bit for bit."""
    for path in demo_corpora.write(out):
        print(path)
