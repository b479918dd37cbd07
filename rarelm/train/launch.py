"""The train stage's process layout: one launcher starting `train.nproc` workers through torchrun's
own launcher (torch.distributed.run), and how a failure reaches the user as one line.

    code = launch(2, 0, worker_argv(Path("params.yaml"), Paths(), progress=True))

The launcher re-runs `python -m stages.train` with the same options under torchrun (`WORKER_MODULE`);
there `LOCAL_RANK` is set and the process is a worker. The workers leave their one-line errors in a
folder of the launcher's (`ERRORS_PREFIX`), which prints the lowest rank's once torchrun has stopped
them all; a worker that failed because another ended first, or whose line rank 0 says too, ends with
exit 2 and says nothing (`quiet_exit`).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

from rarelm.errors import ERROR_DIR_ENV, error_line, first_worker_error, leave_for_launcher
from rarelm.files import remove_stale_folders

WORKER_MODULE = "stages.train"  # what torchrun runs in each worker: the stage itself
EVERY_RANK_WAIT_S = 120  # at most: rank 0 exits within seconds of the others
ERRORS_PREFIX = "rarelm-train-errors-"  # the launcher's folder for its workers' error lines: <prefix><pid>-*


def worker_argv(params_file: Path, paths, progress: bool) -> list[str]:
    """The stage's options that every worker gets, as the launcher got them (`paths`: inputs.Paths)."""
    return ["--params", str(params_file), "--tokenized", str(paths.tokenized), "--rare", str(paths.rare),
            "--weights", str(paths.weights), "--out", str(paths.model), "--metrics", str(paths.metrics),
            "--plots", str(paths.plots), "--cache", str(paths.cache),
            "--progress" if progress else "--no-progress"]


def launch(nproc: int, max_restarts: int, argv: list[str]) -> int:
    """Run the stage's module under torchrun's launcher with `nproc` workers; their exit code."""
    # on use: torch takes seconds to import, which every `rarelm` command would pay
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    from rarelm.train import loopback

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (cores or 1) // nproc)))
    # Restarted workers (train.max_restarts) must not rendezvous through the agent's shared
    # store: they can read the previous attempt's gloo addresses and hang or fail to connect
    # (pytorch/pytorch#135712). A store of their own per attempt avoids it.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    # The workers' one-line errors are printed below (or by a worker, for a traceback); the
    # launcher's logging would add a traceback-sized report for the same failure.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    # one node: torchrun's rendezvous, its agent and the workers on 127.0.0.1 only, where
    # `--standalone` listens on every interface (rarelm.train.loopback)
    loopback.register_rendezvous()
    args = get_args_parser().parse_args(
        [*loopback.launcher_args(nproc, str(uuid.uuid4())), "--max-restarts", str(max_restarts),
         "-m", WORKER_MODULE, *argv])
    # The workers leave their one-line errors here and this launcher prints the first rank's:
    # torchrun stops all workers once one fails, often before rank 0 has printed anything.
    # Named by this launcher's pid: a launcher killed with SIGKILL cannot remove its folder; the
    # next one removes those whose launcher is gone.
    remove_stale_folders(Path(tempfile.gettempdir()), ERRORS_PREFIX)
    with tempfile.TemporaryDirectory(prefix=f"{ERRORS_PREFIX}{os.getpid()}-") as folder:
        os.environ[ERROR_DIR_ENV] = folder
        try:
            run(args)
        except ChildFailedError as exc:
            if line := first_worker_error(Path(folder)):
                print(line, file=sys.stderr, flush=True)
            code = exc.get_first_failure()[1].exitcode
            return code if code > 0 else 128 - code  # killed by signal N: 128 + N, like a shell
        except SignalException as exc:  # SIGTERM/SIGINT: torchrun has stopped the workers
            return 128 + int(exc.sigval)
        finally:
            os.environ.pop(ERROR_DIR_ENV, None)
    return 0


def quiet_exit(exc: BaseException) -> bool:
    """Whether a worker whose training raised `exc` ends with exit 2 and leaves the saying to
    another process: the rank that ended first says why (its line, or its traceback if a bug),
    and rank 0 says a bad input or a full disk once for everyone. False: raise it here."""
    # on use: rarelm.train.dist imports torch
    from rarelm.train.dist import EveryRankError

    line = error_line("train", exc)
    if os.environ.get(ERROR_DIR_ENV) and peer_gone(exc):  # another rank ended first
        return True
    if int(os.environ.get("RANK", "0")) != 0 and line is not None:
        if os.environ.get(ERROR_DIR_ENV):  # our launcher prints the lowest rank's line
            leave_for_launcher(Path(os.environ[ERROR_DIR_ENV]), line)
        if isinstance(exc, EveryRankError):  # rank 0 raised it too: let it say so first
            time.sleep(EVERY_RANK_WAIT_S)  # (torchrun stops this worker when rank 0 exits)
        return True
    return False


def peer_gone(exc: BaseException) -> bool:
    """Whether a collective failed because another worker ended (gloo: its connection closed).

    >>> peer_gone(RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:4509."))
    True
    """
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(
        s in text for s in ("Connection closed by peer", "Connection reset by peer"))
