"""How a stage's process ends: with its parent, and cleanly on SIGTERM.

Shared by every stage under DVC (`stages/__init__.py` calls `follow_dvc` at import) and by
the training workers under torchrun (`rarelm.train.dist`): one way to ask the kernel for a
signal when the parent dies, and one SIGTERM handler that lets `finally` blocks run, except inside
`sigterm_deferred()` blocks (a write to the MLflow store), where it waits for the block's end.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
from collections.abc import Iterator

PR_SET_PDEATHSIG = 1  # prctl option: the signal this process gets when its parent dies
_deferred = {"depth": 0, "pending": False}  # the main thread's sigterm_deferred() blocks


def exit_on_sigterm(*_) -> None:
    """A SIGTERM handler: SystemExit(143) once, so `finally` and `except` blocks run (temporary
    outputs removed, the MLflow run ended FAILED); further SIGTERMs (torchrun's shutdown sends
    more than one) are ignored rather than cutting that short. A SIGKILL still ends a hung process.
    Inside a `sigterm_deferred()` block the exit waits for the block's end. After the main code
    has ended (the interpreter waits for other threads to finish) the process ends at once: a
    SystemExit raised there was printed as a traceback and the process then exited 0."""
    if _deferred["depth"]:
        _deferred["pending"] = True
        return
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if not threading.main_thread().is_alive():  # threading._shutdown: every `finally` has run
        sys.stderr.flush()
        os._exit(128 + signal.SIGTERM)
    sys.exit(128 + signal.SIGTERM)


@contextlib.contextmanager
def sigterm_deferred() -> Iterator[None]:
    """Run the block whole: a SIGTERM that `exit_on_sigterm` receives meanwhile exits at its end.

    For writes to the MLflow store: a SystemExit raised inside one leaves its SQLite transaction
    open, and the connection holds the database's write lock until the process ends, so the
    run's FAILED status after it waits on the lock in vain (1 SIGTERM in 3 during a metrics write
    did so, tests/test_tracking.py). Python runs signal handlers in the main thread only, so
    blocks in other threads need no deferring and are not deferred."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _deferred["depth"] += 1
    try:
        yield
    finally:
        _deferred["depth"] -= 1
    if _deferred["pending"] and not _deferred["depth"]:
        _deferred["pending"] = False
        exit_on_sigterm()


def follow_parent(sig: int) -> int:
    """Have the kernel send `sig` to this process when its parent dies (Linux `prctl`).

    Returns the parent's pid; 0 if it died before the request took effect (then nobody would
    send `sig`, so it is sent now) or where there is no `prctl` (not Linux: nothing to follow).
    """
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: no such safety net
        return 0
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)
        return 0
    return parent


def follow_dvc() -> None:
    """What every stage does first (`stages/__init__.py`, at import): under DVC, end with dvc and
    cleanly on SIGTERM (`die_with_dvc`), and in DVC's workspace hold it for this run
    (rarelm/workspace.py `hold_for_stage`). Outside DVC nothing changes."""
    from pathlib import Path

    dvc = die_with_dvc()
    root = os.environ.get("DVC_ROOT")
    # not in a queued or --temp copy, where $DVC_ROOT names the workspace, not the copy;
    # torchrun's workers hold nothing: their stage's launcher did
    if not dvc or "LOCAL_RANK" in os.environ or not root or Path(root).resolve() != Path.cwd().resolve():
        return
    from rarelm.workspace import hold_for_stage

    hold_for_stage(Path(root), dvc)


def die_with_dvc() -> int:
    """Under DVC ($DVC_STAGE set), end this stage when its parent ends, and on SIGTERM end cleanly.

    DVC runs a stage as `$SHELL -c "<cmd>"`, which bash execs as the one command, and has no SIGTERM
    handler: `kill <dvc pid>` ended dvc alone, and the orphaned stage went on to write outputs
    that no dvc.lock records and, re-run, a second MLflow run. Here the kernel sends SIGTERM
    when the parent dies (Linux `prctl(PR_SET_PDEATHSIG)`; torchrun's workers inherit $DVC_STAGE
    and follow their launcher the same way), and SIGTERM raises SystemExit(143) in the stage's
    own process, so temporary outputs are removed and an MLflow run ends FAILED (the train
    launcher forwards it to its workers through torchrun and exits 143). Where the shell stays
    between (dash, when $SHELL is unset), a thread watches dvc instead. Outside DVC
    (`rarelm <stage>`, `nohup`) nothing changes. Returns dvc's pid (0: not under DVC, or gone).
    """
    if not os.environ.get("DVC_STAGE") or not sys.platform.startswith("linux"):
        return 0
    if "LOCAL_RANK" not in os.environ:  # torchrun's workers: rarelm.train decides (a worker
        signal.signal(signal.SIGTERM, exit_on_sigterm)  # blocked in a collective must die)
    parent = follow_parent(signal.SIGTERM)  # 0: it died already, and SIGTERM is on its way
    if parent and _comm(parent) in SHELLS:  # a $SHELL that did not exec (dash): dvc is the grandparent
        _follow_grandparent(parent, _ppid(parent))
        return _ppid(parent)
    return parent


SHELLS = {"sh", "dash", "bash", "zsh", "ksh", "mksh", "fish"}


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _ppid(pid: int) -> int:
    """The parent of `pid` (0 once it is gone); /proc/<pid>/stat: `pid (comm) state ppid ...`."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _follow_grandparent(shell: int, dvc: int) -> None:
    """SIGTERM to this process once `dvc` ends: the kernel re-parents the shell between us then,
    so a changed parent of the shell says so (a zombie dvc still answers kill(pid, 0))."""
    import time

    def watch() -> None:
        while _ppid(shell) == dvc:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="follow-dvc", daemon=True).start()
