"""User-facing errors: one line on stderr, a non-zero exit, no traceback.

A stage raises `RarelmError("corpus.path: no such file: x.txt")` for anything
the user can fix; `user_errors()` turns it into that one line and exit code 2.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

EXIT_USER_ERROR = 2


class RarelmError(Exception):
    """An expected failure caused by input or params; its message is one line."""


@contextlib.contextmanager
def user_errors(stage: str) -> Iterator[None]:
    """Print a RarelmError as `rarelm <stage>: error: <message>` and exit 2."""
    import typer

    try:
        yield
    except RarelmError as exc:
        message = " ".join(str(exc).split())  # always one line
        print(f"rarelm {stage}: error: {message}", file=sys.stderr)
        raise typer.Exit(EXIT_USER_ERROR) from None
