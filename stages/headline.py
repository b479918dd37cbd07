"""`rarelm headline` (`make headline`): every rare-term remedy against the baseline, as DVC experiments.

    rarelm headline                                   # headline.yaml -> records/headline/ + docs/results.md
    rarelm headline --plan my_plan.yaml --no-page     # another plan; leave the results page alone
    rarelm headline --register                        # + the winner as a registered model version
    rarelm headline --plan my_plan.yaml --so-far      # the screening round so far (while it runs)

Queues the plan's configurations as `dvc exp run --queue` experiments, runs them with
`dvc queue start -j 1` in three rounds (screen on one seed on the val split, combine the
best, confirm the best on the test split with fresh seeds), compares them with `rarelm
compare`'s paired term x seed bootstrap and writes the tables; rounds and rules in
rarelm/report/headline.py. The previous plan took about 90 minutes on 2 CPU cores; headline.yaml now
runs three more experiments (three fresh final seeds) and scores val as well (not timed yet);
interrupted, it picks up the experiments already finished. Not a DVC stage.
"""

from pathlib import Path

import typer

from rarelm.errors import user_errors

app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def headline(
    plan: Path = typer.Option(Path("headline.yaml"), "--plan", help="configurations and seeds"),
    out: Path = typer.Option(Path("records/headline"), "--out", help="reports and the figure go here"),
    page: Path = typer.Option(Path("docs/results.md"), "--page",
                              help="the docs page whose <!-- <section>:start/end --> markers hold tables"),
    no_page: bool = typer.Option(False, "--no-page", help="leave the results page alone"),
    register: bool = typer.Option(False, "--register",
                                  help="register the final round's winner as a new model version "
                                       "(the `champion` alias does not move)"),
    so_far: bool = typer.Option(False, "--so-far",
                                help="queue nothing: compare the screening experiments finished so far "
                                     "with the baseline -> <out>/screen_so_far/, tables on stdout"),
) -> None:
    """Run the headline experiment (three rounds of queued DVC experiments) and write its tables."""
    with user_errors("headline"):
        from rarelm.report.headline import main  # on use: numpy would slow every `rarelm` command's start-up

        main(plan, Path("."), out, None if no_page else page, register, so_far)


if __name__ == "__main__":
    app()
