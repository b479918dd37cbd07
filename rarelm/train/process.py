"""How a stage's process ends: with its parent, and cleanly on SIGTERM.

Shared by every stage under DVC (`stages/__init__.py`) and by the training workers
under torchrun (`rarelm.train.dist`): one way to ask the kernel for a signal when
the parent dies, and one SIGTERM handler that lets `finally` blocks run.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # prctl option: the signal this process gets when its parent dies


def exit_on_sigterm(*_) -> None:
    """A SIGTERM handler: SystemExit(143) once, so `finally` and `except` blocks run (temporary
    outputs removed, the MLflow run ended FAILED); further SIGTERMs (torchrun's shutdown sends
    more than one) are ignored rather than cutting that short. A SIGKILL still ends a hung process."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(128 + signal.SIGTERM)


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
