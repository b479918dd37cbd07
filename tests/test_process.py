"""rarelm/process.py: the SIGTERM handler once the main code has ended (the rest of its behaviour is
tested where the stages use it: tests/test_tracking.py, tests/test_reliability.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

from tests.conftest import REPO

_SCRIPT = textwrap.dedent("""
    import signal, threading, time
    from rarelm.process import exit_on_sigterm
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    threading.Thread(target=time.sleep, args=(5,)).start()  # not a daemon: the interpreter waits for it
    print("main done", flush=True)
""")


def test_sigterm_while_the_interpreter_waits_for_threads_exits_143_without_a_traceback():
    """torchrun's SIGTERM can reach a rank whose main code has ended while a non-daemon thread
    still runs: a SystemExit raised in threading._shutdown was printed as a traceback and the
    process exited 0; it exits 143 at once, silently."""
    proc = subprocess.Popen([sys.executable, "-c", _SCRIPT], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "main done\n"
    time.sleep(0.5)  # the main code has returned: the interpreter joins the thread
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert (proc.returncode, err) == (143, "")
