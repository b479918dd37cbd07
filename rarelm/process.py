"""How a stage's process ends: with its parent, and cleanly on SIGTERM.

Shared by every stage under DVC (`stages/__init__.py`) and by the training workers
under torchrun (`rarelm.train.dist`): one way to ask the kernel for a signal when
the parent dies, and one SIGTERM handler that lets `finally` blocks run, except inside
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
