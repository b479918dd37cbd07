"""The `rarelm` console script: every stage as a subcommand, for use outside DVC.

    rarelm check && rarelm prepare         # what `dvc repro` runs, by hand
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

import sys
from importlib.metadata import version
from pathlib import Path

import typer
from typer._click import exceptions as click_errors  # typer 0.29 vendors click (pinned)

from rarelm import paths
from rarelm.prepare import demo as demo_corpora
from stages.check import check
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


class OneLineTyper(typer.Typer):
    """A Typer app whose usage errors (an unknown option, a missing argument or option, a value of
    the wrong type) are one line on stderr, exit 2, as every other expected error is:

        rarelm compare: error: Missing option '--baseline' / '-b'. (see rarelm compare --help)

    (Typer prints them as a 5-line box under the usage.) `rarelm` alone still shows the help."""

    def __call__(self, *args, **kwargs):
        try:
            code = super().__call__(*args, standalone_mode=False, **kwargs)
        except click_errors.NoArgsIsHelpError as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except click_errors.ClickException as exc:
            ctx = getattr(exc, "ctx", None)
            name = ctx.command_path if ctx is not None else "rarelm"
            message = " ".join(exc.format_message().split())
            hint = f" (see {name} --help)" if isinstance(exc, click_errors.UsageError) else ""
            print(f"{name}: error: {message}{hint}", file=sys.stderr)
            sys.exit(exc.exit_code)
        except typer.Abort:  # Ctrl-C or end of input at a prompt
            print("Aborted!", file=sys.stderr)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


app = OneLineTyper(add_completion=False, no_args_is_help=True, help=__doc__)


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

app.command()(check)
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
