"""Atomic outputs: write beside the target, then rename into place.

A stage that fails half-way leaves the previous output (or nothing) behind,
never a half-written file:

    with atomic_dir("data/prepared") as tmp:   # tmp = data/.prepared.tmp-1234
        (tmp / "train.jsonl").write_text(...)
    # data/prepared now holds exactly what was written, or is unchanged on error

A process killed half-way (SIGKILL, power loss) cannot clean up: the next write of
the same target removes the temporary siblings of processes that no longer run.

A stage with several outputs writes them as one transaction: inside `outputs_together()`
every atomic_dir / atomic_file waits, written, beside its target; at the block's end all targets
are checked, then all are put in place, or none (a failure half-way moves the ones put back):

    with outputs_together():
        with atomic_dir("models/model") as tmp: ...
        write_json("metrics/train.json", metrics)     # `mkdir metrics/train.json`: no output changes
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import os
import shutil
import threading
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


# A file that a param names and a stage reads whole (a glossary, general or replay text): a larger
# one is refused before it is read (a log named by mistake would fill memory).
MAX_INPUT_BYTES = 256 * 2**20


def repository_roots() -> list[Path]:
    """Where a stage's inputs belong: its working directory (the repository, where DVC runs it)
    and $DVC_ROOT (the workspace, seen from a queued experiment's copy under .dvc/tmp/exps)."""
    roots = [Path.cwd().resolve()]
    if os.environ.get("DVC_ROOT"):
        roots.append(Path(os.environ["DVC_ROOT"]).resolve())
    return roots


def inside(path: Path, *folders: Path) -> bool:
    """Whether `path` (resolved: links followed, `..` gone) lies in one of `folders` or the
    repository (`repository_roots`)."""
    return any(path.is_relative_to(folder) for folder in (*folders, *repository_roots()))


_WARNED: set[tuple[str, str]] = set()  # (param, path as written): warned once per process


def warn_if_outside(key: str, path: str | Path) -> None:
    """One warning line (once per process) if the input `path` that param `key` names leads out of
    the repository although it is written as a path in it: relative with `..` (`../../etc/passwd`),
    or through a link (`data/raw/x.txt` -> /etc/passwd). It is read, and what it holds goes into
    the stage's outputs (and wherever they are pushed or logged). Not refused, and an absolute
    path outside the repository (`/data/corpus.txt`) is taken as meant: corpora often live
    elsewhere."""
    from rarelm.errors import warn

    path = Path(path)
    if path.is_absolute() and not inside(Path(os.path.abspath(path))):
        return
    real = path.resolve()
    if inside(real) or (key, str(path)) in _WARNED:
        return
    _WARNED.add((key, str(path)))
    via = "" if Path(os.path.abspath(path)) == real else f" (it leads to {real})"
    warn(f"{key}: {path} lies outside the repository{via}; reading it: what it holds goes into this "
         "stage's outputs")


def read_input(key: str, path: str | Path, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of the file that param `key` names, read whole with the corpus' guards: a regular
    file (a named pipe, device, socket or folder is refused before any read: it is opened
    non-blocking and checked on the open descriptor, so a FIFO cannot hang the stage nor /dev/zero
    fill its memory), at most `limit` bytes, and a warning if it lies outside the repository
    (`warn_if_outside`). A missing file raises FileNotFoundError (the caller names what it is).

    >>> read_input("rare.glossary", "/dev/zero")
    Traceback (most recent call last):
    rarelm.errors.RarelmError: rare.glossary: /dev/zero is a character device, not a file; ...
    """
    import stat

    from rarelm.errors import RarelmError

    path = Path(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO's open would block
    try:
        mode, size = os.fstat(fd).st_mode, os.fstat(fd).st_size
        if not stat.S_ISREG(mode):
            raise RarelmError(f"{key}: {path} is a {kind_of(mode)}, not a file; point it at a regular "
                              "file (UTF-8 text)")
        too_big = (f"{key}: {path} is larger than the {limit:,} bytes a stage reads whole; "
                   "give a smaller file (a slice of it)")
        if size > limit:
            raise RarelmError(too_big.replace("is larger", f"is {size:,} bytes, larger"))
        warn_if_outside(key, path)
        os.set_blocking(fd, True)
        chunks, left = [], limit + 1
        while left and (chunk := os.read(fd, min(left, 1 << 24))):
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:  # it grew while read
        raise RarelmError(too_big)
    return data


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


def remove_stale_folders(parent: Path, prefix: str) -> list[Path]:
    """Remove the folders `<prefix><pid>-*` of this user under `parent` whose process is gone (a
    launcher killed with SIGKILL left its temporary folder, e.g. /tmp/rarelm-train-errors-<pid>-x);
    those of running processes, links and others' folders stay. Returns what was removed."""
    removed = []
    for folder in parent.glob(f"{prefix}*"):
        pid = folder.name[len(prefix):].split("-", 1)[0]
        try:
            mine = folder.lstat().st_uid == os.getuid()
        except OSError:
            continue
        if not pid.isdigit() or not mine or folder.is_symlink() or not folder.is_dir() or _running(int(pid)):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
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


# This thread's open outputs_together() block: its written (temporary, target) pairs, in order.
_TOGETHER = threading.local()


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty temporary folder that replaces `path` when the block succeeds (inside
    `outputs_together()`: when that block does)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_siblings(path)
    tmp = _tmp_sibling(path)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    waiting = False
    try:
        yield tmp
        waiting = _put_in_place_or_wait(tmp, path)
    finally:
        if not waiting:
            shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w") -> Iterator[Any]:
    """Open a temporary file that replaces `path` (fsynced) when the block succeeds (inside
    `outputs_together()`: when that block does)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_siblings(path)
    tmp = _tmp_sibling(path)
    kwargs = {} if "b" in mode else {"encoding": "utf-8", "newline": "\n"}
    waiting = False
    try:
        with open(tmp, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        waiting = _put_in_place_or_wait(tmp, path)
    finally:
        if not waiting:
            tmp.unlink(missing_ok=True)


def _put_in_place_or_wait(tmp: Path, path: Path) -> bool:
    """Put `tmp` in place of `path` now, or (True) leave it to the open outputs_together()."""
    written = getattr(_TOGETHER, "written", None)
    if written is not None:
        written.append((tmp, path))
        return True
    put_in_place([(tmp, path)])
    return False


@contextlib.contextmanager
def outputs_together() -> Iterator[None]:
    """Put every output written inside the block in place at its end, all of them or none (see
    the module docstring); a block inside another joins it."""
    if getattr(_TOGETHER, "written", None) is not None:
        yield
        return
    written: list[tuple[Path, Path]] = []
    _TOGETHER.written = written
    try:
        yield
    except BaseException:
        _remove_all(tmp for tmp, _ in written)
        raise
    finally:
        _TOGETHER.written = None
    try:
        put_in_place(written)
    finally:
        _remove_all(tmp for tmp, _ in written)  # the ones put in place are gone already


def put_in_place(written: list[tuple[Path, Path]]) -> None:
    """Rename each temporary onto its target: first every target checked (a folder where a file
    goes, or the reverse: refused, nothing moved), then each present version kept aside and the
    new one renamed in; a failing rename puts back the ones done. An error names the target."""
    check_held_params()  # not under params other than those the stage started with
    for tmp, path in written:
        _check_target(tmp, path)
    moved: list[tuple[Path, Path | None]] = []  # (target, its previous version moved aside)
    try:
        for tmp, path in written:
            moved.append((path, _keep_aside(path, tmp.is_dir()) if os.path.lexists(path) else None))
            _named(os.rename, tmp, path, target=path)
    except BaseException:
        _put_back(moved, [tmp for tmp, _ in written])
        raise
    _remove_all(old for _, old in moved if old is not None)


def _check_target(tmp: Path, path: Path) -> None:
    """Refuse a target of the other kind (a folder where a file goes, or a file where a folder
    goes), naming it: a rename would fail half-way, or replace it."""
    import errno

    if tmp.is_dir() and os.path.lexists(path) and not os.path.isdir(path):  # a link to one is one
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))
    if not tmp.is_dir() and os.path.isdir(path) and not os.path.islink(path):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))


def _keep_aside(path: Path, new_is_dir: bool) -> Path:
    """Keep `path`'s present version as `.<name>.old-<pid>` until the new one is in: replaced by a
    file, by a hard link (of a link: the link), so the target never goes missing (the rename
    replaces it atomically); else by moving it aside (a folder, or a link where a folder goes)."""
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    if not new_is_dir:
        with contextlib.suppress(OSError):  # no hard links here: moved aside as a folder is
            os.link(path, old, follow_symlinks=False)
            return old
    _named(os.rename, path, old, target=path)
    return old


def _named(rename: Callable[[Path, Path], None], src: Path, dst: Path, target: Path) -> None:
    """`rename(src, dst)`, an OSError of it naming `target` (not a temporary or aside name)."""
    try:
        rename(src, dst)
    except OSError as exc:
        raise type(exc)(exc.errno, exc.strerror, str(target)) from None


def _put_back(moved: list[tuple[Path, Path | None]], temporaries: list[Path]) -> None:
    """Undo put_in_place's renames done so far: each new target back to its temporary (removed
    later), each previous version back in place."""
    for (path, old), tmp in zip(reversed(moved), reversed(temporaries[:len(moved)]), strict=True):
        if not os.path.lexists(tmp) and os.path.lexists(path):
            os.rename(path, tmp)  # it was renamed in: the new version goes
        if old is not None and os.path.lexists(old):
            if _same_file(old, path):  # kept by a hard link, never replaced: rename would do nothing
                os.unlink(old)
            else:
                os.rename(old, path)


def _same_file(a: Path, b: Path) -> bool:
    try:
        sa, sb = os.lstat(a), os.lstat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _remove_all(paths: Iterable[Path]) -> None:
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)


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
