"""User-facing errors: one line on stderr, a non-zero exit, no traceback.

A stage raises `RarelmError("corpus.path: no such file: x.txt")` for anything
the user can fix; `user_errors()` turns it into that one line and exit code 2.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sys
from collections.abc import Iterator

EXIT_USER_ERROR = 2
# Writes that fail for want of space are the user's to fix too (free space, re-run); stages
# write atomically, so each output is either the previous one or absent, never half-written.
DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


class RarelmError(Exception):
    """An expected failure caused by input or params; its message is one line."""


@contextlib.contextmanager
def user_errors(stage: str) -> Iterator[None]:
    """Print a RarelmError (or a full disk) as `rarelm <stage>: error: <message>`, exit 2."""
    import typer

    try:
        yield
    except RarelmError as exc:
        message = " ".join(str(exc).split())  # always one line
        print(f"rarelm {stage}: error: {message}", file=sys.stderr)
        raise typer.Exit(EXIT_USER_ERROR) from None
    except Exception as exc:
        code = disk_errno(exc)
        if code is None:
            raise
        where = f" {exc.filename}:" if getattr(exc, "filename", None) else ""
        print(f"rarelm {stage}: error: cannot write outputs:{where} {os.strerror(code)} "
              f"(disk full or file size limit); no half-written output is left", file=sys.stderr)
        raise typer.Exit(EXIT_USER_ERROR) from None


def disk_errno(exc: BaseException) -> int | None:
    """The errno of a failed write for want of space, else None.

    Rust-backed libraries (tokenizers, safetensors) report it as text, not as OSError:

    >>> disk_errno(Exception("File too large (os error 27)")) == errno.EFBIG
    True
    >>> disk_errno(OSError(errno.ENOENT, "No such file or directory")) is None
    True
    """
    if isinstance(exc, OSError):
        code = exc.errno
    else:
        match = re.search(r"os error (\d+)|code: (\d+)", str(exc))
        code = int(match.group(1) or match.group(2)) if match else None
    return code if code in DISK_ERRNOS else None
