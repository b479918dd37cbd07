"""A run's name, tags and description: which experiment, which commit, which stage, what changed.

The run is named after the DVC experiment under `dvc exp run` ($DVC_EXP_NAME),
else `<stage>-<short commit>`:

    >>> run_name("train", "2c46d84f00aa")
    'train-2c46d84'
"""

from __future__ import annotations

import getpass
import json
import os
from pathlib import Path
from typing import Any

from rarelm import git
from rarelm.tracking.redaction import without_userinfo
from rarelm.tracking.uri import repo_root


def git_commit(cwd: Path | None = None) -> str:
    """The checked-out commit, or "" outside a git repo."""
    return git.output(cwd or repo_root(), "rev-parse", "HEAD")


def run_name(stage: str, commit: str) -> str | None:
    """The DVC experiment's name under `dvc exp run`, else "<stage>-<short commit>".

    >>> run_name("train", "2c46d84f00aa")
    'train-2c46d84'
    """
    return os.environ.get("DVC_EXP_NAME") or (f"{stage}-{commit[:7]}" if commit else None)


def run_tags(stage: str) -> dict[str, str]:
    """The run's name (`mlflow.runName`) and tags.

    `stage` (the stage that started it), `stages` (every stage that logged into it:
    "train,evaluate"), `git_commit`, `DVC_EXP_NAME` and `DVC_EXP_BASELINE_REV` (under
    `dvc exp run`), and MLflow's own `mlflow.source.{name,type,git.commit,git.branch,
    git.repoURL}` (the remote without its user info) and `mlflow.user`.
    """
    commit = os.environ.get("DVC_EXP_BASELINE_REV") or git_commit()
    root = repo_root()
    branch = git.output(root, "rev-parse", "--abbrev-ref", "HEAD")
    try:
        user = getpass.getuser()
    except (OSError, KeyError):  # no name for this uid (a container)
        user = ""
    return {"mlflow.runName": run_name(stage, commit) or "",
            "stage": stage, "stages": stage, "git_commit": commit,
            "DVC_EXP_NAME": os.environ.get("DVC_EXP_NAME", ""),
            "DVC_EXP_BASELINE_REV": os.environ.get("DVC_EXP_BASELINE_REV", ""),
            "mlflow.source.name": f"stages/{stage}.py", "mlflow.source.type": "LOCAL",
            "mlflow.source.git.commit": commit,
            "mlflow.source.git.branch": "" if branch == "HEAD" else branch,
            "mlflow.source.git.repoURL": without_userinfo(git.output(root, "remote", "get-url", "origin")),
            "mlflow.user": user}


def run_note(params, tags: dict[str, str]) -> str:
    """A run's description (mlflow.note.content): which experiment, from which commit, what changed.

    >>> from rarelm.params import Params
    >>> run_note(Params(), {"DVC_EXP_NAME": "exp-a", "git_commit": "2c46d84f00aa"})[:56]
    'DVC experiment exp-a at commit 2c46d84: alpha 0, loss.ra'
    """
    name = tags.get("DVC_EXP_NAME") or tags.get("mlflow.runName") or "a run"
    commit = tags.get("git_commit", "")[:7] or "unknown"
    flat = params.flat()
    shown = ", ".join(f"{k} {param_str(flat[k]) if not isinstance(flat[k], float) else f'{flat[k]:g}'}"
                      for k in ("alpha", "loss.rare_weight", "loss.targets", "seed", "train.max_steps"))
    prefix = "DVC experiment " if tags.get("DVC_EXP_NAME") else ""
    return f"{prefix}{name} at commit {commit}: {shown}. Read summary/ first."


def param_str(value: Any) -> str:
    """A param's value as MLflow stores it: lists and dicts as JSON, the rest as str().

    >>> param_str(["test"]), param_str(0.7)
    ('["test"]', '0.7')
    """
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)
