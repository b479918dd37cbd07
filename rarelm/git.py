"""The one git helper: run `git` in a repository, three ways of treating a failure.

    run(root, "rev-parse", "HEAD")      CompletedProcess: the caller reads returncode and stdout
    checked(root, "write-tree")         stdout stripped; a failure is an error naming the command
    output(root, "rev-parse", "HEAD")   stdout stripped, or "" when git is missing or fails
                                        (for optional facts: a run's commit tag)

Text is UTF-8 (bytes with `text=False`). Git that cannot start or runs past `timeout` seconds
is a RarelmError in `run` and `checked`.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from rarelm.errors import RarelmError

TIMEOUT_S = 60


def run(root: str | Path, *args: str, env: dict[str, str] | None = None, stdin: str | None = None,
        timeout: float = TIMEOUT_S, text: bool = True) -> subprocess.CompletedProcess:
    """`git <args>` in `root`, output captured; `env` adds to (not replaces) this process's own."""
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, input=stdin, timeout=timeout,
                              env=None if env is None else {**os.environ, **env},
                              **({"encoding": "utf-8", "errors": "replace"} if text else {}))
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RarelmError(f"cannot run git: {exc}") from None


def checked(root: str | Path, *args: str, env: dict[str, str] | None = None, stdin: str | None = None,
            error: type[Exception] = RarelmError) -> str:
    """stdout of `git <args>`, stripped; `error("git <args>: <git's message>")` if it fails."""
    result = run(root, *args, env=env, stdin=stdin)
    if result.returncode != 0:
        raise error(f"git {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout.strip()


def output(root: str | Path, *args: str, timeout: float = 10) -> str:
    """stdout of `git <args>`, stripped, or "" when git is missing, fails or times out."""
    try:
        result = run(root, *args, timeout=timeout)
    except RarelmError:
        return ""
    return result.stdout.strip() if result.returncode == 0 else ""
