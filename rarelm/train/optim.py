"""The optimizer and its learning-rate schedule."""

from __future__ import annotations

import math

import torch

from rarelm.params import TrainParams


def lr_at(step: int, p: TrainParams) -> float:
    """Linear warmup to p.lr over warmup_steps, then cosine decay to p.min_lr at max_steps.

    >>> p = TrainParams(lr=1.0, min_lr=0.0, warmup_steps=10, max_steps=110)
    >>> [round(lr_at(s, p), 3) for s in (0, 9, 10, 60, 110)]
    [0.1, 1.0, 1.0, 0.5, 0.0]
    """
    if step < p.warmup_steps:
        return p.lr * (step + 1) / p.warmup_steps
    if step >= p.max_steps:
        return p.min_lr
    progress = (step - p.warmup_steps) / max(1, p.max_steps - p.warmup_steps)
    return p.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (p.lr - p.min_lr)


def set_lr(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def configure_optimizer(model, p: TrainParams, device):
    """AdamW, fused (one kernel per tensor, CPU and CUDA; `device` is the model's); weight decay
    on matrices only.

    The fused kernel is elementwise, so as deterministic as the loop it replaces, and on
    CPU it saves ~10% of a step of the demo model against torch's default per-tensor loop.
    """
    params = [q for q in model.parameters() if q.requires_grad]
    groups = [{"params": [q for q in params if q.dim() >= 2], "weight_decay": p.weight_decay},
              {"params": [q for q in params if q.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=p.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
