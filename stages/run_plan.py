"""`rarelm run-plan`: a fixed headline plan's experiments as concurrent stage processes, without DVC.

    rarelm run-plan --plan smollm2/foldoc_en.yaml --out records/realtext/smollm2_foldoc_en --jobs 9 \\
        --set tracking.required=false           # on a GPU machine without mlflow
    rarelm run-plan --plan ... --only data     # the data stages alone (to carry them to a GPU machine)
    rarelm headline --plan smollm2/foldoc_en.yaml --out records/realtext/smollm2_foldoc_en   # then the tables

Runs every configuration and decode variant x final seed of the plan through the real stages
(`python -m stages.<name>`) under `--work`, sharing the data stages and trained models where their
params agree, and records each experiment under `<out>/runs/` as `rarelm headline` records DVC
experiments: the headline then writes its tables from the records. rarelm/report/plan_runner.py.
"""

from pathlib import Path

import typer

from rarelm.errors import user_errors

app = typer.Typer(add_completion=False, help=__doc__)


@app.command(name="run-plan")
def run_plan(
    plan: Path = typer.Option(..., "--plan", help="a fixed headline plan (screen_seeds: [])"),
    out: Path = typer.Option(..., "--out", help="records go to <out>/runs/, as `rarelm headline` keeps them"),
    work: Path = typer.Option(Path(".cache/run-plan"), "--work", help="stage outputs, models and logs"),
    jobs: int = typer.Option(4, "--jobs", help="trainings and evaluations at once (one GPU takes several)"),
    sets: list[str] = typer.Option([], "--set", help="key=value on top of every experiment's params"),
    only: str = typer.Option("all", "--only", help="all, or data: stop after the data stages"),
    commit: str = typer.Option("", "--commit", help="the code's commit for the records (default: HEAD)"),
) -> None:
    """Run a fixed plan's experiments through the stages, without DVC, and record them."""
    with user_errors("run-plan"):
        import signal

        from rarelm.errors import RarelmError
        from rarelm.process import exit_on_sigterm
        from rarelm.report.plan_runner import run_plan as run

        signal.signal(signal.SIGTERM, exit_on_sigterm)  # the stage processes are stopped too

        if only not in ("all", "data"):
            raise RarelmError(f"--only {only!r}: must be all or data")
        report = run(plan, Path("."), out, work, jobs, sets, only, commit,
                     log=lambda m: print(m, flush=True))
        print(f"run-plan: {len(report['experiments'])} experiments of {plan}, {report['wall_s']:.0f} s "
              f"on {report['machine']['name']} -> {out / 'runs'}")


if __name__ == "__main__":
    app()
