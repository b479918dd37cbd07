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
from pathlib import Path

EXIT_USER_ERROR = 2
# Set by the train launcher for its torchrun workers: a folder where each worker leaves its
# one-line error (`rank-<RANK>`) for the launcher to print after the job. torchrun stops every
# worker as soon as one fails, often before the others (rank 0 included) could print anything.
ERROR_DIR_ENV = "RARELM_ERROR_DIR"
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
    except Exception as exc:
        line = error_line(stage, exc)
        if line is None:
            raise
        say(line)
        raise typer.Exit(EXIT_USER_ERROR) from None


def error_line(stage: str, exc: BaseException) -> str | None:
    """The one line an expected failure is shown as; None for a bug (its traceback is shown).

    >>> error_line("train", RarelmError("train.lr: must be\\n finite"))
    'rarelm train: error: train.lr: must be finite'
    >>> error_line("train", KeyError("x")) is None
    True
    """
    if isinstance(exc, RarelmError):
        message = " ".join(str(exc).split())  # always one line
        return f"rarelm {stage}: error: {message}"
    reason = disk_error(exc)
    if reason is None:
        return None
    where = f" {exc.filename}:" if getattr(exc, "filename", None) else ""
    return (f"rarelm {stage}: error: cannot write outputs:{where} {reason} "
            f"(disk full or file size limit); no half-written output is left")


def say(line: str) -> None:
    """Print an error line on stderr; a worker of the train launcher leaves it to the launcher."""
    folder = os.environ.get(ERROR_DIR_ENV)
    if folder and "LOCAL_RANK" in os.environ:
        leave_for_launcher(Path(folder), line)
        return
    print(line, file=sys.stderr, flush=True)


def leave_for_launcher(folder: Path, line: str) -> None:
    """Write this worker's error line to `folder/rank-<RANK>` (whole or not at all)."""
    rank = os.environ.get("RANK", "0")
    tmp = folder / f".rank-{rank}.tmp-{os.getpid()}"
    try:
        tmp.write_text(line + "\n", encoding="utf-8")
        os.replace(tmp, folder / f"rank-{rank}")
    except OSError:  # the launcher is gone with its folder: say it where it can still be seen
        print(line, file=sys.stderr, flush=True)


def first_worker_error(folder: Path) -> str | None:
    """The line left by the lowest rank that left one (`leave_for_launcher`), else None.

    >>> import tempfile; d = Path(tempfile.mkdtemp())
    >>> _ = (d / "rank-10").write_text("b\\n"); _ = (d / "rank-2").write_text("a\\n")
    >>> first_worker_error(d)
    'a'
    """
    ranks = sorted((int(p.name[5:]), p) for p in folder.glob("rank-*") if p.name[5:].isdigit())
    for _, path in ranks:
        line = path.read_text(encoding="utf-8", errors="replace").strip()
        if line:
            return line
    return None


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
