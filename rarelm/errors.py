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
        reason = disk_error(exc)
        if reason is None:
            raise
        where = f" {exc.filename}:" if getattr(exc, "filename", None) else ""
        print(f"rarelm {stage}: error: cannot write outputs:{where} {reason} "
              f"(disk full or file size limit); no half-written output is left", file=sys.stderr)
        raise typer.Exit(EXIT_USER_ERROR) from None


# PyTorch's zip writer (torch.save) reports a failed write without its errno.
_TORCH_SHORT_WRITE = re.compile(
    r"unexpected pos \d+ vs \d+|PytorchStreamWriter failed writing|file write failed")


def disk_error(exc: BaseException) -> str | None:
    """Why a write failed for want of space (a short reason), or None for any other error.

    Rust-backed libraries (tokenizers, safetensors) and torch.save report it as text:

    >>> disk_error(Exception("File too large (os error 27)"))
    'File too large'
    >>> disk_error(RuntimeError("[enforce fail at inline_container.cc:672] unexpected pos 202048 vs 202000"))
    'a write was cut short'
    >>> disk_error(OSError(errno.ENOENT, "No such file or directory")) is None
    True
    """
    if isinstance(exc, OSError):
        return os.strerror(exc.errno) if exc.errno in DISK_ERRNOS else None
    text = str(exc)
    match = re.search(r"os error (\d+)|code: (\d+)", text)
    if match and int(match.group(1) or match.group(2)) in DISK_ERRNOS:
        return os.strerror(int(match.group(1) or match.group(2)))
    return "a write was cut short" if _TORCH_SHORT_WRITE.search(text) else None
