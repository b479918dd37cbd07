"""How `train` spreads the model over its ranks: `train.strategy: ddp | fsdp`.

    model = wrap(model, "fsdp", dist, amp_dtype)   # FSDP2: sharded in place, per block + root
    with gradient_sync(model, last_micro_step): ...  # reduce gradients on the last micro-step only
    full = full_state_dict(model)                   # the whole model on rank 0 ({} elsewhere)

ddp (default): every rank holds the whole model, its gradients and the AdamW state
(about 16 bytes per parameter in fp32) and DDP all-reduces the gradients. fsdp:
PyTorch's FSDP2 (`torch.distributed.fsdp.fully_shard`) shards parameters, gradients
and optimizer state over the ranks (about 16 / N bytes per parameter at N ranks),
all-gathers one transformer block's parameters just before it runs and frees them
after (per block, then the root for the embeddings, final norm and output layer),
and reduce-scatters the gradients. Its mixed-precision policy keeps the fp32 master
parameters sharded and gathers them in the training dtype (bf16 / fp16), so the
gathered copies and the traffic are half the size, while gradients are reduced in
fp32. Autocast stays on around the forward as under DDP, so the ops run at the
same precision under both strategies.

Which blocks: the model's `_no_split_modules` (transformers names its transformer
block classes there: GPT2Block, LlamaDecoderLayer, ...), so any causal LM that
transformers can load is sharded per block without a table of architectures.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from rarelm.errors import RarelmError


def check_world_size(strategy: str, world_size: int) -> None:
    """FSDP has nothing to shard over in one process: say so rather than run DDP's job slower."""
    if strategy == "fsdp" and world_size < 2:
        raise RarelmError(
            f"params: train.strategy = 'fsdp' is not allowed with {world_size} process "
            "(FSDP shards over >= 2 ranks: set train.nproc >= 2, or train.strategy: ddp)")


def transformer_blocks(model) -> list[Any]:
    """The model's transformer blocks: modules whose class transformers marks as not to split."""
    names = set(getattr(model, "_no_split_modules", None) or [])  # a peft model passes it on
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise RarelmError(f"train.strategy = 'fsdp': {type(model).__name__} names no transformer "
                          "block classes (_no_split_modules) to shard by")
    return blocks


def wrap(model, strategy: str, dist, amp_dtype):
    """The model the loop trains: DDP-wrapped, FSDP2-sharded (in place), or as is (one process)."""
    if strategy == "fsdp":
        policy = MixedPrecisionPolicy(param_dtype=amp_dtype, reduce_dtype=torch.float32)
        for block in transformer_blocks(model):
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)  # the rest: embeddings, final norm, output layer
        return model
    if dist.ddp:
        device = dist.device
        return DDP(model, device_ids=[dist.local_rank] if device.type == "cuda" else None)
    return model


def gradient_sync(model, sync: bool):
    """A context in which backward reduces gradients over the ranks only if `sync`.

    Gradient accumulation: the micro-steps before the last keep their gradients local
    (DDP's `no_sync`; FSDP2's `set_requires_gradient_sync`).
    """
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2
        model.set_requires_gradient_sync(sync)
        return contextlib.nullcontext()
    if not sync and hasattr(model, "no_sync"):  # DDP
        return model.no_sync()
    return contextlib.nullcontext()


def local(tensor):
    """This rank's part of a tensor: the local shard of an FSDP2 DTensor, else the tensor."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def whole(tensor):
    """A tensor's full value on every rank (an FSDP2 DTensor gathered; a plain tensor as is)."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def state_bytes(model, optimizer) -> int:
    """Bytes this rank holds of parameters, gradients and optimizer state (activations aside)."""
    total = 0
    for q in model.parameters():
        total += local(q).nbytes
        if q.grad is not None:
            total += local(q.grad).nbytes
    for per_param in optimizer.state.values():
        total += sum(local(v).nbytes for v in per_param.values() if hasattr(v, "nbytes"))
    return total


def full_state_dict(model) -> dict[str, Any]:
    """The whole model's state dict on rank 0's CPU (collective: every rank must call it)."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                cpu_offload=True))
