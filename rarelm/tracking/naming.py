"""A run's name, tags and description: which experiment, corpus and model, which commit, what changed.

The run is named after the DVC experiment under `dvc exp run` ($DVC_EXP_NAME), else after the
stage and the commit, then the corpus and the model, so that two `dvc repro` runs of one commit on
two corpora differ at a glance. The description names the corpus and the model under either, and
the params that differ from the commit's params.yaml (`dvc exp run -S alpha=0.7` leaves 0.7 in
the workspace, so the next `dvc repro` trains with it):

    >>> from rarelm.params import Params
    >>> run_name("train", "2c46d84f00aa", Params())
    'train-2c46d84-demo_en-gpt2-4x128'
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


def run_name(stage: str, commit: str, params=None) -> str | None:
    """The DVC experiment's name under `dvc exp run` (the name `dvc exp show` and every rarelm
    command use), else "<stage>-<short commit>", with `params` followed by the corpus and the
    model (corpus_label, model_label).

    >>> run_name("train", "2c46d84f00aa")
    'train-2c46d84'
    """
    if os.environ.get("DVC_EXP_NAME"):
        return os.environ["DVC_EXP_NAME"]
    name = f"{stage}-{commit[:7]}" if commit else stage
    if params is None:
        return name if commit else None
    return f"{name}-{corpus_label(params.corpus.path)}-{model_label(params.model)}"


def corpus_label(path: str) -> str:
    """A corpus path's name without its suffixes.

    >>> corpus_label("data/raw/demo_en.txt.gz"), corpus_label("/data/pg15/"), corpus_label("")
    ('demo_en', 'pg15', 'corpus')
    """
    name = Path(path).name
    return name.split(".")[0] or name or "corpus"


def model_label(model) -> str:
    """The model's folder or hub id, its last two parts (`base/model` -> base-model), or the sizes of
    the GPT-2-style model trained from scratch.

    >>> from rarelm.params import ModelParams
    >>> model_label(ModelParams()), model_label(ModelParams(name_or_path="HuggingFaceTB/SmolLM2-135M@main"))
    ('gpt2-4x128', 'HuggingFaceTB-SmolLM2-135M')
    """
    if not model.name_or_path:
        return f"gpt2-{model.n_layer}x{model.n_embd}"
    return "-".join(Path(model.name_or_path.split("@")[0]).parts[-2:])


def run_tags(stage: str, params=None) -> dict[str, str]:
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
    return {"mlflow.runName": run_name(stage, commit, params) or "",
            "stage": stage, "stages": stage, "git_commit": commit,
            "DVC_EXP_NAME": os.environ.get("DVC_EXP_NAME", ""),
            "DVC_EXP_BASELINE_REV": os.environ.get("DVC_EXP_BASELINE_REV", ""),
            "mlflow.source.name": f"stages/{stage}.py", "mlflow.source.type": "LOCAL",
            "mlflow.source.git.commit": commit,
            "mlflow.source.git.branch": "" if branch == "HEAD" else branch,
            "mlflow.source.git.repoURL": without_userinfo(git.output(root, "remote", "get-url", "origin")),
            "mlflow.user": user}


def run_note(params, tags: dict[str, str], committed: dict[str, Any] | None = None) -> str:
    """A run's description (mlflow.note.content): which experiment, from which commit, on which
    corpus and model, with which params; `committed`: the commit's params (flat), whose differences
    from `params` are named (what `-S` changed, or what an earlier `dvc exp run` left in params.yaml).

    >>> from rarelm.params import Params
    >>> note = run_note(Params(alpha=0.7), {"DVC_EXP_NAME": "exp-a", "git_commit": "2c46d84f00aa"},
    ...                 Params().flat())
    >>> print(note.replace("; ", ";\\n"))
    DVC experiment exp-a at commit 2c46d84;
    corpus data/raw/demo_en.txt.gz (en);
    model: GPT-2-style, 4 layers x 128, from scratch;
    alpha 0.7, loss.rare_weight 0, loss.targets rare_bucket, seed 1337, train.max_steps 1000;
    changed from the commit's params.yaml: alpha 0 -> 0.7. Read summary/ first.
    """
    name = tags.get("DVC_EXP_NAME") or tags.get("mlflow.runName") or "a run"
    commit = tags.get("git_commit", "")[:7] or "unknown"
    flat = params.flat()
    shown = ", ".join(f"{k} {value_str(flat[k])}"
                      for k in ("alpha", "loss.rare_weight", "loss.targets", "seed", "train.max_steps"))
    prefix = "DVC experiment " if tags.get("DVC_EXP_NAME") else ""
    model = params.model.name_or_path or (f"GPT-2-style, {params.model.n_layer} layers x "
                                          f"{params.model.n_embd}, from scratch")
    parts = [f"{prefix}{name} at commit {commit}", f"corpus {params.corpus.path} ({params.corpus.language})",
             f"model: {model}", shown]
    if committed is not None:
        changed = [f"{k} {value_str(committed.get(k))} -> {value_str(v)}" for k, v in flat.items()
                   if committed.get(k) != v]
        parts.append("changed from the commit's params.yaml: " + (", ".join(changed) or "nothing"))
    return "; ".join(parts) + ". Read summary/ first."


def committed_params(commit: str) -> dict[str, Any] | None:
    """The params.yaml of `commit` beside the one this stage reads (./params.yaml), validated and
    flat as Params.flat(); None where git, the commit or a valid file is missing."""
    from rarelm.errors import RarelmError
    from rarelm.params import Params, read_yaml

    text = git.output(Path.cwd(), "show", f"{commit}:./params.yaml") if commit else ""
    try:
        return Params.from_dict(read_yaml(text) or {}).flat() if text else None
    except (RarelmError, ValueError, TypeError):
        return None


def value_str(value: Any) -> str:
    """A param's value in a description: floats shortest (0.0 -> 0), the rest as param_str.

    >>> value_str(0.0), value_str(5e-4), value_str("rare_bucket"), value_str(["test"])
    ('0', '0.0005', 'rare_bucket', '["test"]')
    """
    return f"{value:g}" if isinstance(value, float) else param_str(value)


def param_str(value: Any) -> str:
    """A param's value as MLflow stores it: lists and dicts as JSON, the rest as str().

    >>> param_str(["test"]), param_str(0.7)
    ('["test"]', '0.7')
    """
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)
