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


# The stages (or commands) whose user_errors() block is running, innermost last: `warn`'s prefix.
_RUNNING: list[str] = []


@contextlib.contextmanager
def user_errors(stage: str) -> Iterator[None]:
    """Print a RarelmError, a full disk, an OS error the user can fix (no permission, a dangling
    link, ...) or running out of memory as `rarelm <stage>: error: <message>`, exit 2."""
    import typer

    _RUNNING.append(stage)
    try:
        check_arguments(sys.argv[1:])
        yield
    except Exception as exc:
        line = error_line(stage, exc)
        if line is None:
            raise
        say(line)
        raise typer.Exit(EXIT_USER_ERROR) from None
    finally:
        _RUNNING.pop()


def warn(message: str) -> None:
    """Print `rarelm <stage>: warning: <message>` (one line) on stderr, the stage being that of the
    running user_errors() block. A torchrun worker says nothing: its launcher read the same
    inputs first and said it once."""
    if "LOCAL_RANK" in os.environ:
        return
    prefix = f"rarelm {_RUNNING[-1]}" if _RUNNING else "rarelm"
    print(f"{prefix}: warning: {' '.join(message.split())}", file=sys.stderr, flush=True)


def check_arguments(argv: list[str]) -> None:
    """Refuse a command-line argument that is not valid UTF-8 (Python keeps its bytes as lone
    surrogates, which fail later, deep inside a tokenizer or a file name).

    >>> check_arguments(["generate", "caf\\udcc3"])
    Traceback (most recent call last):
    rarelm.errors.RarelmError: argument 2 (b'caf\\xc3') is not valid UTF-8 (byte 0xc3 at offset 3); ...
    """
    for number, arg in enumerate(argv, 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError as exc:
            raw = arg.encode("utf-8", "surrogateescape")
            offset = len(arg[:exc.start].encode("utf-8", "surrogateescape"))
            shown = repr(raw) if len(raw) <= 80 else repr(raw[:77]) + "..."
            raise RarelmError(f"argument {number} ({shown}) is not valid UTF-8 (byte 0x{raw[offset]:02x} "
                              f"at offset {offset}); pass text in UTF-8") from None


def error_line(stage: str, exc: BaseException) -> str | None:
    """The one line an expected failure is shown as; None for a bug (its traceback is shown).

    >>> error_line("train", RarelmError("train.lr: must be\\n finite"))
    'rarelm train: error: train.lr: must be finite'
    >>> error_line("train", KeyError("x")) is None
    True

    A write error names the output, not the temporary it was written to:

    >>> line = error_line("prepare", OSError(errno.EROFS, "Read-only file system", "data/.prepared.tmp-7/a"))
    >>> line[:line.index(" (")]
    'rarelm prepare: error: cannot write outputs: data/prepared/a: Read-only file system'
    >>> line[line.index(" ("):line.index(";")]
    ' (the file system is mounted read-only: remount it writable or write elsewhere)'
    """
    if isinstance(exc, RarelmError):
        message = " ".join(str(exc).split())  # always one line
        return f"rarelm {stage}: error: {message}"
    reason = disk_error(exc)
    if reason is not None:
        filename = getattr(exc, "filename", None)
        where = f" {real_path(os.fsdecode(filename))}:" if isinstance(filename, (str, bytes)) else ""
        why = ("the file system is mounted read-only: remount it writable or write elsewhere"
               if reason == os.strerror(errno.EROFS) else "disk full or file size limit")
        return (f"rarelm {stage}: error: cannot write outputs:{where} {reason} ({why}); "
                "no half-written output is left")
    message = os_error(exc) or memory_error(exc, stage)
    return None if message is None else f"rarelm {stage}: error: {message}"


# What to do about an OSError the user can fix, by errno ({path}: the file it names).
OS_FIXES = {
    errno.EACCES: "give your user access to it (ls -ld; chmod/chown) or use another folder",
    errno.EPERM: "give your user access to it (ls -ld; lsattr for the immutable attribute)",
    errno.ENOTDIR: "a part of the path is a file where a folder is needed: move that file aside",
    errno.EISDIR: "a folder is where a file is needed: move the folder aside",
    errno.ELOOP: "a symbolic link on the path points back into itself: fix or remove the link",
    errno.ENOENT: "check the path (and run the stage that writes it first)",
    errno.ENAMETOOLONG: "use a shorter path",
    errno.EEXIST: "something other than a folder is where a folder is needed: move it aside",
    errno.ENOMEM: "the machine is out of memory: free some, or use smaller batches",
}


def os_error(exc: BaseException) -> str | None:
    """One line for an OSError a user can fix: the path, what is wrong, what to do; else None.

    A link on the path whose target is missing (`.cache` -> a removed folder) or that is in a
    loop is named as such, whatever the errno (mkdir reports either as "File exists").

    >>> os_error(IsADirectoryError(errno.EISDIR, "Is a directory", ".cache/train/.signing-key"))
    '.cache/train/.signing-key: Is a directory (a folder is where a file is needed: move the folder aside)'
    >>> os_error(ConnectionResetError(errno.ECONNRESET, "reset")) is None
    True
    """
    if not isinstance(exc, OSError) or exc.errno is None:
        return None
    path = exc.filename if isinstance(exc.filename, (str, bytes, os.PathLike)) else None
    found = bad_link(path) if path else None
    if found is not None:
        link, loop = found
        where = "" if os.fsdecode(path) == link else f"{os.fsdecode(path)}: "
        if loop:
            return (f"{where}{link} is a symbolic link that leads back to itself (a loop): fix or "
                    "remove the link")
        return (f"{where}{link} is a symbolic link to {os.readlink(link)}, which does not exist: "
                "create its target or remove the link")
    if exc.errno not in OS_FIXES:
        return None
    where = f"{real_path(os.fsdecode(path))}: " if path else ""
    return f"{where}{os.strerror(exc.errno)} ({OS_FIXES[exc.errno]})"


# `.<name>.tmp-<pid>` / `.<name>.old-<pid>`: rarelm.files' temporaries beside an output <name>
_TEMPORARY = re.compile(r"(?:(?<=/)|^)\.([^/]+)\.(?:tmp|old)-\d+(?=/|$)")


def real_path(path: str) -> str:
    """The output a path inside a stage's temporary stands for: what an error line names.

    >>> real_path("data/.prepared.tmp-123/train.jsonl"), real_path(".train.json.tmp-9")
    ('data/prepared/train.jsonl', 'train.json')
    >>> real_path("data/prepared/.hidden")
    'data/prepared/.hidden'
    """
    return _TEMPORARY.sub(r"\1", path)


def bad_link(path: str | os.PathLike) -> tuple[str, bool] | None:
    """The first component of `path` that is a symbolic link to nothing (False) or in a loop
    (True), else None.

    >>> import tempfile; d = Path(tempfile.mkdtemp()); (d / "cache").symlink_to(d / "gone")
    >>> bad_link(d / "cache" / "train") == (str(d / "cache"), False)
    True
    """
    try:
        parts = Path(os.fsdecode(path)).parts
    except (TypeError, ValueError):
        return None
    for i in range(1, len(parts) + 1):
        here = os.path.join(*parts[:i])
        if not os.path.lexists(here):
            return None
        if os.path.islink(here):
            try:
                os.stat(here)
            except OSError as exc:  # ENOENT: its target is gone; ELOOP: links in a loop
                if exc.errno in (errno.ENOENT, errno.ELOOP):
                    return here, exc.errno == errno.ELOOP
    return None


# Where a stage's memory goes, to name in an out-of-memory line.
MEMORY_KNOBS = {
    "train": "lower train.batch_size (raise train.grad_accum to keep the batch) or model.block_size",
    "evaluate": "lower eval.batch_size",
    "compare": "lower --bootstrap",
    "generate": "lower --max-tokens or the prompt's length",
}
_TORCH_OOM = re.compile(r"can't allocate memory|out of memory|CUDA out of memory", re.I)


def memory_error(exc: BaseException, stage: str) -> str | None:
    """One line for running out of memory (Python's MemoryError, torch's allocators), else None.

    >>> print(memory_error(RuntimeError("[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: "
    ...                                 "can't allocate memory: you tried to allocate 8 bytes."), "evaluate"))
    out of memory (DefaultCPUAllocator: can't allocate memory); lower eval.batch_size
    """
    if isinstance(exc, MemoryError):
        what = "MemoryError"
    elif type(exc).__name__ == "OutOfMemoryError" or (
            isinstance(exc, RuntimeError) and _TORCH_OOM.search(str(exc))):
        text = " ".join(str(exc).split())
        what = ("DefaultCPUAllocator: can't allocate memory" if "DefaultCPUAllocator" in text
                else text[:120])
    else:
        return None
    return f"out of memory ({what}); {MEMORY_KNOBS.get(stage, 'free memory or use smaller inputs')}"


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
