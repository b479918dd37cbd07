"""Atomic outputs: write beside the target, then rename into place.

A stage that fails half-way leaves the previous output (or nothing) behind,
never a half-written file:

    with atomic_dir("data/prepared") as tmp:   # tmp = data/.prepared.tmp-1234
        (tmp / "train.jsonl").write_text(...)
    # data/prepared now holds exactly what was written, or is unchanged on error

A process killed half-way (SIGKILL, power loss) cannot clean up: the next write of
the same target removes the temporary siblings of processes that no longer run.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rarelm.fmt import csv_cell


def kind_of(mode: int) -> str:
    """What a file of st_mode `mode` is, in words, for an error line.

    >>> import stat; kind_of(stat.S_IFIFO), kind_of(stat.S_IFDIR)
    ('named pipe (FIFO)', 'folder')
    """
    import stat

    kinds = {stat.S_ISREG: "file", stat.S_ISDIR: "folder", stat.S_ISFIFO: "named pipe (FIFO)",
             stat.S_ISSOCK: "socket", stat.S_ISCHR: "character device", stat.S_ISBLK: "block device",
             stat.S_ISLNK: "symbolic link"}
    return next((name for test, name in kinds.items() if test(mode)), "special file")


def check_held_params() -> None:
    """rarelm.params.check_held_params (imported here on use: params does not import files)."""
    from rarelm.params import check_held_params as check

    check()


def _tmp_sibling(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def remove_stale_siblings(path: Path) -> list[Path]:
    """Remove `.<name>.tmp-<pid>` / `.<name>.old-<pid>` beside `path` whose process is gone
    (killed mid-write); those of running processes stay. Returns what was removed.

    (On a file system shared by several machines a pid names a process of this machine only:
    there, do not write one target from two machines at once, which is unsafe anyway.)
    """
    removed = []
    for kind in ("tmp", "old"):
        for sibling in path.parent.glob(f".{path.name}.{kind}-*"):
            pid = sibling.name.rsplit("-", 1)[1]
            if not pid.isdigit() or _running(int(pid)):
                continue
            if sibling.is_dir() and not sibling.is_symlink():
                shutil.rmtree(sibling, ignore_errors=True)
            else:
                sibling.unlink(missing_ok=True)
            removed.append(sibling)
    return removed


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):  # another user's process (or no such pid number)
        return True
    return True


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty temporary folder that replaces `path` when the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_siblings(path)
    tmp = _tmp_sibling(path)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        check_held_params()  # not under params other than those the stage started with
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        if path.exists():
            path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w") -> Iterator[Any]:
    """Open a temporary file that replaces `path` (fsynced) when the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_siblings(path)
    tmp = _tmp_sibling(path)
    kwargs = {} if "b" in mode else {"encoding": "utf-8", "newline": "\n"}
    try:
        with open(tmp, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        check_held_params()  # not under params other than those the stage started with
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json(path: str | Path, data: Any) -> None:
    """Write `data` as indented, key-sorted JSON, atomically."""
    with atomic_file(path) as f:
        json.dump(data, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")


def write_csv(path: str | Path, header: Sequence[str], rows: Iterable[Mapping[str, Any]],
              cell: Callable[[Any], Any] = csv_cell) -> None:
    """Write `rows` (dicts; a missing key is an empty cell) under `header` as CSV, atomically.

    Every cell goes through `cell` (default: floats with 6 significant digits, "" for None or
    NaN); lines end in "\n"; a cell with a comma or a quote is quoted:

        write_csv("plots/x.csv", ["step", "loss"], [{"step": 1, "loss": 2.0 / 3}, {"step": 2}])
        # step,loss / 1,0.666667 / 2,
    """
    with atomic_file(path) as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        writer.writerows([cell(row.get(column)) for column in header] for row in rows)


def load_array(path: str | Path, dtype: Any, length: int, stage: str, mismatch: str) -> Any:
    """A 1-D .npy array written by `stage`, checked for dtype and length (a RarelmError if not).

    `mismatch` tells the user, in the error, what a wrong dtype or length means.
    """
    import numpy as np

    from rarelm.errors import RarelmError

    path = Path(path)
    try:
        array = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise RarelmError(f"{path}: not found; run the {stage} stage first") from None
    except ValueError as exc:
        raise RarelmError(f"{path}: not a readable .npy array ({exc})") from None
    if array.dtype != dtype or array.shape != (length,):
        raise RarelmError(
            f"{path}: {array.dtype} {list(array.shape)}, expected {np.dtype(dtype).name} [{length}] "
            f"{mismatch}, re-run {stage}")
    return array


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def sha256_file(path: str | Path, chunk: int = 1 << 22) -> str:
    """The file's sha256, hex, read in chunks (bounded memory)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def share(folder: str | Path) -> None:
    """Give every file under `folder` the mode a plain write gives (0644 under umask 022).

    safetensors (`save_pretrained`) writes model.safetensors 0600 (a private temporary file renamed
    into place), so a model folder shared with others, served or pushed, had unreadable weights.
    """
    umask = current_umask()
    for path in Path(folder).rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(0o666 & ~umask)


def current_umask() -> int:
    """The process's umask, read without changing it (Linux: /proc/self/status); elsewhere set and
    restored at once (a file another thread creates in between would get mode 0666)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    umask = os.umask(0o022)
    os.umask(umask)
    return umask
