"""One Typer script per DVC stage; `python -m stages.<name>` is what dvc.yaml runs.

Each script reads params.yaml, calls the `rarelm` library, writes its outputs
atomically and prints a one-line summary. Its options default to the DAG's layout
(rarelm/paths.py, which dvc.yaml lists the same); they override it for use outside DVC.
"""


def _die_with_dvc() -> int:
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
    import os
    import signal
    import sys

    from rarelm.process import exit_on_sigterm, follow_parent

    if not os.environ.get("DVC_STAGE") or not sys.platform.startswith("linux"):
        return 0
    if "LOCAL_RANK" not in os.environ:  # torchrun's workers: rarelm.train decides (a worker
        signal.signal(signal.SIGTERM, exit_on_sigterm)  # blocked in a collective must die)
    parent = follow_parent(signal.SIGTERM)  # 0: it died already, and SIGTERM is on its way
    if parent and _comm(parent) in SHELLS:  # a $SHELL that did not exec (dash): dvc is the grandparent
        _follow_grandparent(parent, _ppid(parent))
        return _ppid(parent)
    return parent


def _hold_workspace(dvc: int) -> None:
    """Under DVC in the workspace (not a queued or --temp copy, where $DVC_ROOT names the
    workspace, not the copy), enter dvc as a reader of DVC's experiments lock on the workspace,
    so that a second `dvc exp run` is refused before it writes params.yaml (rarelm/workspace.py).
    torchrun's workers hold nothing: their stage's launcher did. One warning line if it cannot."""
    import os
    from pathlib import Path

    root = os.environ.get("DVC_ROOT")
    if not dvc or "LOCAL_RANK" in os.environ or not root or Path(root).resolve() != Path.cwd().resolve():
        return
    from rarelm.workspace import hold

    try:
        hold(Path(root), dvc)
    except Exception as exc:  # noqa: BLE001 - DVC's lock errors are no OSError; the run goes on
        import sys

        reason = " ".join(str(exc).split()) or type(exc).__name__
        print(f"rarelm {os.environ.get('DVC_STAGE')}: warning: cannot hold the workspace for this run "
              f"({reason}); a `dvc exp run` started meanwhile may change params.yaml under it",
              file=sys.stderr, flush=True)


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
    import os
    import signal
    import threading
    import time

    def watch() -> None:
        while _ppid(shell) == dvc:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="follow-dvc", daemon=True).start()


_hold_workspace(_die_with_dvc())
