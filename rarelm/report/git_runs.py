"""Runs in git: DVC experiments (refs/exps/...) and commits, and the files a run holds at one.

    >>> import tempfile
    >>> experiment_refs(Path(tempfile.mkdtemp()))     # not a git repository: no experiments
    []
"""

from __future__ import annotations

import re
from pathlib import Path

from rarelm import git
from rarelm.errors import RarelmError


def _head(repo: Path) -> str:
    return git.output(repo, "rev-parse", "--verify", "-q", "HEAD")


def experiment_refs(repo: Path) -> list[tuple[str, str, str]]:
    """Every DVC experiment as (name, baseline commit, experiment commit).

    DVC 3 keeps a finished experiment as the git ref refs/exps/<baseline[:2]>/<baseline[2:]>/<name>;
    its own bookkeeping lives under refs/exps/{apply,celery,exec,temp}/ and refs/exps/stash.
    """
    out = git.run(repo, "for-each-ref", "--format=%(refname) %(objectname)", "refs/exps/")
    found = []
    for line in out.stdout.splitlines():
        ref, _, commit = line.partition(" ")
        parts = ref.split("/")
        if len(parts) == 5 and re.fullmatch(r"[0-9a-f]{2}", parts[2]) and re.fullmatch(r"[0-9a-f]{38}",
                                                                                       parts[3]):
            found.append((parts[4], parts[2] + parts[3], commit))
    return found


def experiments_of_head(repo: Path) -> list[str]:
    """Names of the DVC experiments whose baseline is HEAD (what `dvc exp show` lists under it)."""
    head = _head(repo)
    return sorted(name for name, baseline, _ in experiment_refs(repo) if baseline == head)


def resolve_experiment(name: str, repo: Path) -> str | None:
    """The commit of DVC experiment `name`, as `dvc exp` resolves it (one of HEAD's if several)."""
    matches = [(baseline, commit) for exp, baseline, commit in experiment_refs(repo) if exp == name]
    if len(matches) > 1:
        head = _head(repo)
        matches = [m for m in matches if m[0] == head]
        if len(matches) != 1:
            raise RarelmError(f"{name}: several DVC experiments have this name (for different baseline "
                              "commits); give the experiment's commit instead")
    return matches[0][1] if matches else None


def resolve_commit(revision: str, repo: Path) -> str | None:
    """The commit a git revision names, or None if it names none."""
    out = git.run(repo, "rev-parse", "--verify", "-q", f"{revision}^{{commit}}")
    return out.stdout.strip() if out.returncode == 0 else None


def read_git(repo: Path, commit: str, rel: str) -> str | None:
    """The text of file `rel` at `commit`, or None if it has none."""
    out = git.run(repo, "show", f"{commit}:./{rel}", text=False)  # bytes: not UTF-8 is an error
    if out.returncode != 0:
        return None
    try:
        return out.stdout.decode("utf-8")
    except UnicodeDecodeError:
        raise RarelmError(f"{rel} at {commit[:10]} is not UTF-8") from None

