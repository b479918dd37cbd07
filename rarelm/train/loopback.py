"""A single-node training job listens on loopback only: nothing of it is reachable from the network.

torchrun's stores bind every interface whatever address they are given (`*:<port>`), and they
answer anyone who connects, unauthenticated. On one machine every process of the job reaches
the others through 127.0.0.1, so the train launcher (rarelm/train/launch.py) and its workers bind that:

- the launcher's rendezvous (`--rdzv-backend rarelm-loopback`, registered by
  `register_rendezvous()`): torchrun's c10d rendezvous on a store bound to 127.0.0.1, the node's
  address 127.0.0.1 (so the workers' MASTER_ADDR is loopback);
- the workers' process group (rarelm.train.dist.Dist.setup): rank 0's store bound to
  127.0.0.1:MASTER_PORT (`loopback_store`), gloo's and NCCL's sockets on the loopback interface
  (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, unless set).

A multi-node job (WORLD_SIZE > LOCAL_WORLD_SIZE: torchrun by hand with rendezvous params, see
README) keeps torchrun's env:// rendezvous: its nodes must reach each other over the network.

>>> single_node({"WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"})
True
>>> single_node({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"})
False
"""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Mapping
from typing import Any

LOOPBACK = "127.0.0.1"
RENDEZVOUS = "rarelm-loopback"  # the launcher's --rdzv-backend
RENDEZVOUS_TIMEOUT_S = 60  # as torchrun's c10d backend reads its store (read_timeout)


def single_node(env: Mapping[str, str] = os.environ) -> bool:
    """Whether every worker of this torchrun job runs on this machine."""
    return env.get("WORLD_SIZE", "1") == env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", "1"))


def loopback_interface() -> str:
    """The name of the network interface that holds 127.0.0.1 ("lo" on Linux, "lo0" on macOS)."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == LOOPBACK for a in addresses):
            return name
    return "lo"


def serve_store(port: int, **options) -> Any:
    """A TCPStore server (`is_master`) listening on 127.0.0.1:`port` only (0: a free port).

    The store takes the socket's descriptor as it is (`master_listen_fd`, not a copy): it is
    handed over, and closed here only if the store could not be made."""
    import torch.distributed as td

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free
        sock.bind((LOOPBACK, port))
        port = sock.getsockname()[1]
    except OSError:
        sock.close()
        raise
    fd = sock.detach()
    try:
        return td.TCPStore(LOOPBACK, port, is_master=True, multi_tenant=True, master_listen_fd=fd,
                           **options)
    except BaseException:
        os.close(fd)
        raise


def loopback_store(rank: int, world_size: int, port: int, timeout: datetime.timedelta) -> Any:
    """The process group's store at 127.0.0.1:`port`: rank 0 serves it on loopback only (where
    the env:// rendezvous binds every interface), the other ranks connect to it."""
    import torch.distributed as td

    if rank == 0:
        return serve_store(port, world_size=world_size, timeout=timeout)
    return td.TCPStore(LOOPBACK, port, world_size, is_master=False, timeout=timeout)


def use_loopback_interface() -> None:
    """Have gloo and NCCL listen and connect on the loopback interface (unless the user set it)."""
    name = loopback_interface()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", name)
    os.environ.setdefault("NCCL_SOCKET_IFNAME", name)


def _handler(params) -> Any:
    """torchrun's c10d rendezvous (dynamic, restarts included) on a store bound to 127.0.0.1."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler

    class LoopbackBackend(C10dRendezvousBackend):
        name = RENDEZVOUS  # torchrun checks the handler's backend against --rdzv-backend

    store = serve_store(0, timeout=datetime.timedelta(seconds=RENDEZVOUS_TIMEOUT_S))
    return create_handler(store, LoopbackBackend(store, params.run_id), params)


def register_rendezvous() -> None:
    """Make `--rdzv-backend rarelm-loopback` known to torchrun (this process's launcher)."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(RENDEZVOUS, _handler)


def launcher_args(nproc: int, run_id: str) -> list[str]:
    """torchrun's arguments for one node of `nproc` workers, all of it on loopback (instead of
    `--standalone`, whose store binds every interface).

    >>> launcher_args(2, "r1")[:6]
    ['--nnodes', '1', '--nproc-per-node', '2', '--rdzv-backend', 'rarelm-loopback']
    """
    return ["--nnodes", "1", "--nproc-per-node", str(nproc), "--rdzv-backend", RENDEZVOUS,
            "--rdzv-endpoint", f"{LOOPBACK}:0", "--rdzv-id", run_id, "--local-addr", LOOPBACK]
