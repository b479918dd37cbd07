"""rarelm/workspace.py: a DVC run holds the workspace in DVC's own experiments lock.

The whole case, two real `dvc exp run` at once: tests/test_reliability.py
`test_a_second_dvc_exp_run_is_refused_before_it_changes_the_first`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dvc.fs import localfs
from dvc.lock import LockError
from dvc.rwlock import rwlock

from rarelm.workspace import HELD, dvc_entry, hold, locks_dir


def readers(root: Path) -> list[dict]:
    path = locks_dir(root) / "rwlock"
    return json.loads(path.read_text()).get("read", {}).get(HELD, []) if path.exists() else []


def dvc_would_write_the_workspace(root: Path) -> None:
    """What `dvc exp run` does before it stashes and writes the workspace (WorkspaceQueue.put)."""
    locks_dir(root).mkdir(parents=True, exist_ok=True)
    with rwlock(str(locks_dir(root)), localfs, "dvc exp run -S seed=2", [], [HELD, "refs/exps/workspace"],
                False):
        pass


@pytest.fixture
def fake_dvc(tmp_path):
    """`<tmp>/bin/dvc exp run -S seed=1`: a Python script run through its #! line, as the venv's
    dvc is (its argv in /proc starts with the interpreter); it sleeps."""
    script = tmp_path / "bin" / "dvc"
    script.parent.mkdir()
    script.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(120)\n")
    script.chmod(0o755)
    proc = subprocess.Popen([str(script), "exp", "run", "-S", "seed=1"])
    proc.cmd = f"{script} exp run -S seed=1"
    yield proc
    proc.kill()
    proc.wait()


def test_a_held_workspace_refuses_dvc_until_the_run_ends(tmp_path, fake_dvc):
    (tmp_path / ".dvc").mkdir()
    dvc_would_write_the_workspace(tmp_path)  # free: DVC takes and releases it
    assert hold(tmp_path, fake_dvc.pid) is True
    assert readers(tmp_path) == [{"pid": fake_dvc.pid, "cmd": fake_dvc.cmd}]
    assert hold(tmp_path, fake_dvc.pid) is False  # a later stage of the same run
    assert len(readers(tmp_path)) == 1
    with pytest.raises(LockError, match=rf"busy, it is being blocked by:\s+\(PID {fake_dvc.pid}\): "
                                        rf"{re.escape(fake_dvc.cmd)}"):
        dvc_would_write_the_workspace(tmp_path)
    fake_dvc.kill()
    fake_dvc.wait()
    deadline = time.monotonic() + 60  # the releaser polls every 0.1 s; a bound, not a measurement
    while readers(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert readers(tmp_path) == []
    dvc_would_write_the_workspace(tmp_path)


def test_only_a_dvc_process_holds_the_workspace(tmp_path):
    (tmp_path / ".dvc").mkdir()
    with subprocess.Popen(["sleep", "60"]) as other:
        try:
            assert dvc_entry(other.pid) is None
            assert hold(tmp_path, other.pid) is False
        finally:
            other.kill()
    assert readers(tmp_path) == []
