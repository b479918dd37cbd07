"""This process's place in the training job: torchrun's environment, or one process without it.

    dist = Dist.setup()          # process group (gloo on CPU, NCCL on GPU) under torchrun
    dist.all_reduce(tensor)      # the collectives the loop uses: no-ops in one process
    dist.close()

    end_worker(app)              # a torchrun worker's entry: its exit, safe with gloo's threads
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

import torch
import torch.distributed as td
from torch.distributed.constants import default_pg_timeout

from rarelm.errors import RarelmError
from rarelm.process import follow_parent
from rarelm.train import loopback

# The last barrier's work, referenced until the process ends. Gloo's worker thread drops its own
# reference just after the barrier completes; were that the last one, it would free the barrier's
# earlier all-reduces there, whose tensors need the GIL. When the process group is freed right
# after the job's final barrier (the DDP model goes with `train`'s return), the main thread holds
# the GIL while joining that thread: both wait for ever (seen once, rank 1 of a two-process CI
# run: ~ProcessGroupGloo in std::thread::join, the worker in ~AsyncBarrierWork waiting for the
# GIL). Kept here, the work is freed by Python, with the GIL, after the threads are gone.
_BARRIERS: list[Any] = []
# Whether this process started a process group (Dist.setup): see end_worker.
_GROUP = {"started": False}


class EveryRankError(RarelmError):
    """A RarelmError that every rank raises at the same point: rank 0 says it (after ending its
    MLflow run), the others wait for torchrun to stop them (rarelm/train/launch.py), so the one line
    is said before the job ends."""


def die_with_parent() -> None:
    """Have the kernel SIGKILL this worker when its torchrun agent dies (Linux).

    torchrun starts workers in sessions of their own, so killing the job's process
    group (SIGKILL, OOM killer) would leave them training on as orphans, racing a
    restarted run for the checkpoints and outputs.
    """
    follow_parent(signal.SIGKILL)


@dataclasses.dataclass
class Dist:
    """This process's place in the job (torchrun's environment; one process without it)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: Any = None

    @property
    def main(self) -> bool:
        return self.rank == 0

    @classmethod
    def setup(cls) -> Dist:
        if "LOCAL_RANK" in os.environ:
            die_with_parent()
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            torch.cuda.set_device(local)
            device = torch.device("cuda", local)
        else:
            device = torch.device("cpu")
        # Under torchrun always a process group (and DDP or FSDP), even for one process: the same
        # code path (NCCL or gloo) whatever the world size.
        if "LOCAL_RANK" in os.environ:
            _init_process_group("nccl" if device.type == "cuda" else "gloo", rank, world,
                                device if device.type == "cuda" else None)
        return cls(rank, local, world, device)

    @property
    def ddp(self) -> bool:
        return td.is_available() and td.is_initialized()

    def all_reduce(self, tensor, op: str = "sum") -> None:
        if self.ddp:
            td.all_reduce(tensor, op={"sum": td.ReduceOp.SUM, "min": td.ReduceOp.MIN}[op])

    def broadcast(self, value: Any) -> Any:
        if not self.ddp:
            return value
        box = [value]
        td.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, value: Any) -> list[Any]:
        """Every rank's `value`, on rank 0 (other ranks get [])."""
        if not self.ddp:
            return [value]
        out = [None] * self.world_size if self.main else None
        td.gather_object(value, out, dst=0)
        return out or []

    def barrier(self) -> None:
        if self.ddp:
            work = td.barrier(async_op=True)
            work.wait()
            _BARRIERS[:] = [work]  # the last one lives as long as the process: see _BARRIERS

    def close(self) -> None:
        if self.ddp and td.is_initialized():
            td.destroy_process_group()


def _init_process_group(backend: str, rank: int, world: int, device_id) -> None:
    """torchrun's process group; on one node through loopback only (rarelm.train.loopback), across
    nodes by its env:// rendezvous (MASTER_ADDR, MASTER_PORT), as the multi-node README says."""
    if loopback.single_node() and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        loopback.use_loopback_interface()
        store = loopback.loopback_store(rank, world, int(os.environ["MASTER_PORT"]), default_pg_timeout)
        td.init_process_group(backend, store=store, rank=rank, world_size=world, device_id=device_id)
    else:  # across nodes, or workers that share the agent's store (it listens, not they)
        td.init_process_group(backend, device_id=device_id)
    _GROUP["started"] = True


def end_worker(main: Callable[[], Any]) -> NoReturn:
    """Run a torchrun worker's `main` and end the process with its exit code; after a failure
    in a process that started a process group, without the interpreter's finalization.

    A failed worker's process group is never joined: its gloo threads may be blocked on a peer
    that still waits for this rank (joining would hang until gloo's 30-minute timeout, where
    exiting lets torchrun stop the job), and a thread that ends a collective after the main
    code frees that collective's tensors, which needs the GIL. During finalization a thread
    that takes the GIL is ended by pthread_exit, whose unwinding through a noexcept destructor
    is std::terminate: "terminate called without an active exception" and SIGABRT (1 run in ~10
    under load: rank 1's broadcast failed when rank 0 ran out of memory, and its gloo thread freed
    the broadcast's tensors while the interpreter was finalizing). Everything this process must
    do on the way out has been done by then: the MLflow run ended, temporaries removed, the error
    line said or left for the launcher (`finally` and `except` blocks run before `main` returns);
    os._exit then ends gloo's threads with the process. A run that succeeded closed its group
    after the last barrier and ends normally."""
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:  # a bug: its traceback, as the interpreter would print it
        traceback.print_exc()
        code = 1
    if code != 0 and _GROUP["started"]:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _exit_code(code: Any) -> int:
    """The exit status `sys.exit(code)` gives (a message is printed, status 1).

    >>> _exit_code(None), _exit_code(2), _exit_code(True)
    (0, 2, 1)
    """
    if code is None:
        return 0
    if isinstance(code, int):
        return int(code)
    print(code, file=sys.stderr)
    return 1
