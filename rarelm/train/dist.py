"""This process's place in the training job: torchrun's environment, or one process without it.

    dist = Dist.setup()          # process group (gloo on CPU, NCCL on GPU) under torchrun
    dist.all_reduce(tensor)      # the collectives the loop uses: no-ops in one process
    dist.close()
"""

from __future__ import annotations

import dataclasses
import os
import signal
from typing import Any

import torch
import torch.distributed as td

from rarelm.errors import RarelmError
from rarelm.process import follow_parent

# The last barrier's work, referenced until the process ends. Gloo's worker thread drops its own
# reference just after the barrier completes; were that the last one, it would free the barrier's
# earlier all-reduces there, whose tensors need the GIL. When the process group is freed right
# after the job's final barrier (the DDP model goes with `train`'s return), the main thread holds
# the GIL while joining that thread: both wait for ever (seen once, rank 1 of a two-process CI
# run: ~ProcessGroupGloo in std::thread::join, the worker in ~AsyncBarrierWork waiting for the
# GIL). Kept here, the work is freed by Python, with the GIL, after the threads are gone.
_BARRIERS: list[Any] = []


class EveryRankError(RarelmError):
    """A RarelmError that every rank raises at the same point: rank 0 says it (after ending its
    MLflow run), the others wait for torchrun to stop them (stages/train.py), so the one line
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
            td.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                  device_id=device if device.type == "cuda" else None)
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

