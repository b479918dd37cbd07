"""rarelm.train.dist: how a torchrun worker ends when a collective failed under it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import REPO

# Rank 1 starts a broadcast that rank 0 never joins, then holds the GIL (a switch interval of 100 s)
# until rank 0 has exited and the broadcast's gloo thread has dropped its reference to the tensor
# and waits for the GIL to free it; then rank 1 fails. An object freed during finalization sleeps,
# which hands the GIL on: that is where the thread met a finalizing interpreter in the OOM test.
WORKER = textwrap.dedent('''
    import os, sys, time
    from pathlib import Path

    import torch
    import torch.distributed as td

    from rarelm.train.dist import Dist, end_worker

    FLAG = Path(sys.argv[2])


    class SlowTeardown:
        def __del__(self):
            time.sleep(0.5)


    def main():
        dist = Dist.setup()
        if dist.rank == 0:
            deadline = time.monotonic() + 120
            while not FLAG.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            os._exit(0)
        global teardown
        teardown = SlowTeardown()
        teardown.tensor = torch.zeros(4)
        td.broadcast(teardown.tensor, src=0, async_op=True)  # the handle dropped: gloo's alone
        sys.setswitchinterval(100)
        FLAG.touch()
        deadline = time.monotonic() + 120
        while teardown.tensor._use_count() > 1 and time.monotonic() < deadline:
            pass
        settle = time.monotonic() + 0.5  # the thread, past its decrement, is waiting for the GIL
        while time.monotonic() < settle:
            pass
        raise SystemExit(2)


    if sys.argv[1] == "end_worker":
        end_worker(main)
    main()
''')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_ranks(script: Path, how: str, tmp_path: Path) -> list[subprocess.CompletedProcess]:
    """Run `script how FLAG` as ranks 0 and 1 of a gloo group on loopback; both results."""
    env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "PYTHONPATH": str(REPO)}
    flag = tmp_path / f"flag-{how}"
    procs = [subprocess.Popen([sys.executable, str(script), how, str(flag)], cwd=tmp_path,
                              env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in (0, 1)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return results


def test_a_failed_worker_ends_without_std_terminate_from_a_gloo_thread(tmp_path):
    """Was: "terminate called without an active exception" and SIGABRT, 1 run in ~10 of the OOM
    test under load (tests/test_reliability.py): a gloo thread freed a failed broadcast's tensors
    while the interpreter finalized. The plain exit still aborts here, every time."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    _, plain = two_ranks(script, "plain", tmp_path)
    assert plain.returncode == -signal.SIGABRT, plain.stderr
    assert "terminate called without an active exception" in plain.stderr
    rank0, rank1 = two_ranks(script, "end_worker", tmp_path)
    assert (rank1.returncode, rank1.stderr, rank1.stdout) == (2, "", "")
    assert (rank0.returncode, rank0.stderr) == (0, "")
