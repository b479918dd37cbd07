"""`rarelm compare`: evaluated runs against a baseline, with paired term x seed bootstrap intervals.

    rarelm compare exp-a1b2c exp-d3e4f --baseline HEAD
    rarelm compare alpha07-s1 alpha07-s2 --baseline base-s1 --baseline base-s2 --out reports
    rarelm compare 0123456789abcdef0123456789abcdef --baseline HEAD~1 --metric exact_match
    rarelm compare --experiments --baseline HEAD --out reports    # what `make report` runs
    rarelm compare exp-a exp-b --baseline HEAD --register        # + the winner as a model version

A RUN is a DVC experiment name, a git revision, an MLflow run id (32 hex digits)
or `workspace`; each must hold per-occurrence results (metrics/eval_occurrences.jsonl,
or eval/eval_occurrences.jsonl in the MLflow run). Runs that differ only by `seed`
are replicates: the bootstrap resamples their seeds together with the terms. Prints
the difference table and a table of run-level figures (perplexity, false insertion;
intervals over seeds); `--out DIR` also writes
DIR/index.html (self-contained), DIR/report.md and DIR/report.json. The statistics
are explained in rarelm/report/statistics.py. `--register` registers the best
configuration's run model (rarelm/report/winner.py: best term NLL per character, baseline
included) as `rarelm register` would; the `champion` alias does not move. Not a DVC stage.
"""

import sys
import tempfile
from pathlib import Path

import typer

from rarelm.errors import RarelmError, user_errors
from rarelm.paths import PARAMS

app = typer.Typer(add_completion=False, help=__doc__)


MAX_BOOTSTRAP = 100_000  # resamples: each holds a difference per metric; 10^8 ran out of memory


def _check_options(bootstrap: int, seed: int, out: Path | None) -> None:
    """One line for an option out of bounds, or an --out that is not a folder.

    >>> _check_options(100_000_000, 0, None)
    Traceback (most recent call last):
    rarelm.errors.RarelmError: --bootstrap = 100000000 is not allowed (must be in 1..100000)
    """
    if not 1 <= bootstrap <= MAX_BOOTSTRAP:
        raise RarelmError(f"--bootstrap = {bootstrap} is not allowed (must be in 1..{MAX_BOOTSTRAP})")
    if not 0 <= seed <= 2**32 - 1:
        raise RarelmError(f"--seed = {seed} is not allowed (must be in 0..4294967295)")
    if out is not None and (out.exists() or out.is_symlink()) and not out.is_dir():
        raise RarelmError(f"--out {out} is not a folder; give a folder (made if missing): the report "
                          "is index.html, report.md and report.json in it")


@app.command()
def compare(
    runs: list[str] = typer.Argument(None, help="runs to compare: DVC experiment, git revision, "
                                                "MLflow run id or 'workspace'"),
    baseline: list[str] = typer.Option(..., "--baseline", "-b",
                                       help="the baseline run (repeat for several seeds)"),
    experiments: bool = typer.Option(False, "--experiments",
                                     help="also compare every DVC experiment of HEAD"),
    out: Path = typer.Option(None, "--out", help="write index.html, report.md and report.json here"),
    metric: list[str] = typer.Option(None, "--metric",
                                     help="exact_match | first_token_acc | nll | choice_acc | nll_per_char | "
                                          "nll_per_term | token_acc | first_token_rr (repeatable; default "
                                          "all)"),
    bootstrap: int = typer.Option(2000, "--bootstrap", help="bootstrap resamples (of terms and seeds)"),
    seed: int = typer.Option(0, "--seed", help="bootstrap seed: same seed, same intervals"),
    split: str = typer.Option("", "--split", help="only this split's occurrences and eval.json figures "
                                                  "(default: every split's occurrences)"),
    log_mlflow: bool = typer.Option(False, "--log-mlflow",
                                    help="also log the report into the baseline's MLflow run (compare/)"),
    register: bool = typer.Option(False, "--register",
                                  help="register the best configuration's run model as a new version "
                                       "(rarelm/report/winner.py; the `champion` alias does not move)"),
) -> None:
    """Compare RUNs with the --baseline: metrics per configuration, differences, 95% intervals."""
    with user_errors("compare"):
        _check_options(bootstrap, seed, out)  # before the runs are read (that takes a while)
        # on use: numpy would slow every `rarelm` command's start-up
        from rarelm.report.compare import compare as compare_runs
        from rarelm.report.git_runs import experiments_of_head
        from rarelm.report.mlflow_runs import log_report
        from rarelm.report.occurrences import METRICS, same_occurrences
        from rarelm.report.page import write_report
        from rarelm.report.runs import load_run
        from rarelm.report.tables import markdown
        from rarelm.report.winner import prepare_registration

        base_runs = [load_run(ref, split=split) for ref in baseline]
        other = [load_run(ref, split=split) for ref in runs or []]
        found = experiments_of_head(Path(".")) if experiments else []
        for name in found:
            if name in (runs or []) or name in baseline:
                continue
            try:
                run = load_run(name, split=split)
            except RarelmError as exc:  # an experiment from before per-occurrence results
                print(f"rarelm compare: warning: skipped experiment {exc}", file=sys.stderr)
                continue
            if not same_occurrences(run, base_runs[0]):  # another corpus, split or term list
                print(f"rarelm compare: warning: skipped experiment {name}: evaluated on other "
                      f"occurrences than {base_runs[0].name}", file=sys.stderr)
                continue
            other.append(run)
        report = compare_runs(base_runs, other, metric or tuple(METRICS), bootstrap, seed)
        # checked before any output: a winner the registry cannot take is the one-line error
        winner = prepare_registration(report, ".", PARAMS, by="rarelm compare") if register else None
        text = markdown(report)
        paths = write_report(report, out) if out is not None else []
    sys.stdout.write(text)
    if winner is not None:
        with user_errors("compare"):
            print(f"rarelm compare: registered the winner {winner.label} (run {winner.run_id}) as "
                  f"{winner.register()}", file=sys.stderr)
    if paths:
        print(f"rarelm compare: report in {paths[0]}", file=sys.stderr)
    if log_mlflow:
        with tempfile.TemporaryDirectory() as tmp:
            logged = log_report(paths or write_report(report, tmp), base_runs[0])
        if logged:
            print(f"rarelm compare: report logged to MLflow run {logged} (compare/)", file=sys.stderr)


if __name__ == "__main__":
    app()
