"""A DVC run in the workspace holds it, so that no `dvc exp run` can change it meanwhile.

`dvc exp run -S seed=1341` started while another run goes on in the same workspace stashed,
reset and re-applied the workspace and wrote `seed: 1341` into params.yaml before DVC's repo
lock refused it (DVC releases that lock while a stage's command runs): the first run's later
stages read 1341. What DVC takes before it touches the workspace is its experiments' read-write
lock on "workspace" (`.dvc/tmp/exps/rwlock`, taken by `dvc exp run`, `--temp` and `--queue`
alike). So the first stage that DVC runs in the workspace enters its dvc process there as a
reader of "workspace", in DVC's own format and under DVC's own guard file, and DVC refuses the
second run before it writes anything:

    ERROR: 'workspace' is busy, it is being blocked by:
      (PID 4711): .venv/bin/dvc exp run -S seed=1340

A small process started by that stage removes the entry once the dvc process has ended (else
the next DVC command would remove it, warning that the process "had been killed").
Not covered: a second run started in the second or two between the first's own stash and its
first stage (nothing holds the workspace yet), and runs in queued or `--temp` copies (they hold
nothing: each has a workspace of its own).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HELD = "workspace"  # the path DVC's experiments lock before they write the workspace


def locks_dir(root: Path) -> Path:
    """Where DVC keeps its experiments' read-write lock (`get_exp_rwlock`: <tmp_dir>/exps)."""
    return root / ".dvc" / "tmp" / "exps"


def dvc_entry(pid: int) -> dict[str, Any] | None:
    """The lock entry DVC would write for the dvc process `pid` ({"pid", "cmd": its argv joined,
    as DVC's `" ".join(sys.argv)`}); None if `pid` is no dvc process.

    >>> dvc_entry(os.getpid()) is None  # a test runner, not dvc
    True
    """
    import psutil

    try:
        argv = psutil.Process(pid).cmdline()
    except (psutil.Error, OSError):
        return None
    if len(argv) > 1 and os.path.basename(argv[0]).startswith("python"):
        argv = argv[1:]  # the interpreter of a script run through its #! line; sys.argv starts after it
    if argv[:2] == ["-m", "dvc"]:
        argv = argv[1:]
    if not argv or os.path.basename(argv[0]) != "dvc":
        return None
    return {"pid": pid, "cmd": " ".join(argv)}


@contextlib.contextmanager
def _edited(root: Path) -> Iterator[dict]:
    """DVC's experiments lock file, read and written back under its guard (DVC's own code)."""
    from dvc.config import Config
    from dvc.fs import localfs
    from dvc.rwlock import _edit_rwlock

    folder = locks_dir(root)
    folder.mkdir(parents=True, exist_ok=True)
    hardlink = bool(Config(dvc_dir=str(root / ".dvc"))["core"].get("hardlink_lock", False))
    with _edit_rwlock(str(folder), localfs, hardlink) as lock:
        yield lock


def hold(root: Path, dvc_pid: int) -> bool:
    """Enter the dvc process `dvc_pid` as a reader of root's workspace, unless it is one already
    (an earlier stage of the same run), and start the process that removes the entry when dvc
    ends. True if entered now; False if held already or `dvc_pid` is no dvc process."""
    entry = dvc_entry(dvc_pid)
    if entry is None:
        return False
    with _edited(root) as lock:
        readers = lock["read"][HELD]
        if any(reader.get("pid") == dvc_pid for reader in readers):
            return False
        readers.append(entry)
    subprocess.Popen([sys.executable, "-m", "rarelm.workspace", str(root), json.dumps(entry)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     close_fds=True, start_new_session=True, cwd=root)
    return True


def hold_for_stage(root: Path, dvc_pid: int) -> None:
    """`hold` for a stage that DVC runs in the workspace `root` (rarelm/process.py `follow_dvc`),
    so that a second `dvc exp run` is refused before it writes params.yaml; one warning line
    if it cannot, and the run goes on."""
    try:
        hold(root, dvc_pid)
    except Exception as exc:  # noqa: BLE001 - DVC's lock errors are no OSError; the run goes on
        reason = " ".join(str(exc).split()) or type(exc).__name__
        print(f"rarelm {os.environ.get('DVC_STAGE')}: warning: cannot hold the workspace for this run "
              f"({reason}); a `dvc exp run` started meanwhile may change params.yaml under it",
              file=sys.stderr, flush=True)


def release(root: Path, entry: dict[str, Any]) -> None:
    """Remove `entry` from root's workspace readers (as DVC's `_release_read` does)."""
    with _edited(root) as lock:
        readers = lock["read"].get(HELD, [])
        if entry in readers:
            readers.remove(entry)
        if not readers:
            lock["read"].pop(HELD, None)
        if not lock["read"]:
            del lock["read"]


def release_when_ended(root: Path, entry: dict[str, Any], poll_s: float = 0.1) -> None:
    """Wait until the process of `entry` has ended (a zombie counts as ended), then release it."""
    import psutil

    try:
        process = psutil.Process(entry["pid"])
        while process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
            time.sleep(poll_s)
    except psutil.NoSuchProcess:
        pass
    release(root, entry)


if __name__ == "__main__":  # the releaser `hold` starts: python -m rarelm.workspace <root> <entry>
    release_when_ended(Path(sys.argv[1]), json.loads(sys.argv[2]))
