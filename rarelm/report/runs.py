"""Finding an evaluated run: by DVC experiment name, git revision, MLflow run id or `workspace`.

    >>> read_file(Path("no/such/file"))     # an absent file is None; an unreadable one an error
"""

from __future__ import annotations

import re
from pathlib import Path

from rarelm.errors import RarelmError
from rarelm.report.git_runs import read_git, resolve_commit, resolve_experiment
from rarelm.report.mlflow_runs import load_mlflow_run
from rarelm.report.run_data import WORKSPACE, RunData, load_files, split_summary


def load_run(ref: str, repo: str | Path = ".", split: str = "") -> RunData:
    """Load a run by DVC experiment name, git revision, MLflow run id or `workspace`.

    Raises a one-line RarelmError if the run is not found or holds no per-occurrence results.
    """
    repo = Path(repo)
    if ref == WORKSPACE:
        run = load_files(ref, WORKSPACE, WORKSPACE, WORKSPACE, lambda rel: read_file(repo / rel))
    elif re.fullmatch(r"[0-9a-f]{32}", ref):
        run = load_mlflow_run(ref)
    else:
        commit = resolve_experiment(ref, repo)
        experiment = ref if commit else ""
        if commit is None:
            commit = resolve_commit(ref, repo)
            if commit is None:
                raise RarelmError(f"{ref}: not a DVC experiment, git revision, MLflow run id "
                                  f"(32 hex digits) or '{WORKSPACE}'")
        run = load_files(ref, ref, "git", commit, lambda rel: read_git(repo, commit, rel))
        run.experiment = experiment
    return for_split(run, split)


def for_split(run: RunData, split: str) -> RunData:
    """`run` narrowed to one split's occurrences and eval.json figures (all of it if `split` is "")."""
    if split:
        run.rows = [r for r in run.rows if r["split"] == split]
        if not run.rows:
            raise RarelmError(f"{run.name}: no evaluated occurrences in split {split!r}")
        run.summary = split_summary(run.summary, run.params, split)
    return run


def read_file(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise RarelmError(f"{path}: cannot read ({exc})") from None

