"""Validation during training: plain and rare-target cross-entropy on fixed val windows."""

from __future__ import annotations

import torch

from rarelm.objectives.rare_weight import rare_weighted_loss
from rarelm.train.batches import logits_after_lead, to_batch


def validation_loss(model, samples, windows, batch_size, device, autocast, is_rare, dist, lead=()):
    """(plain CE, rare-target CE) over `windows`, sharded across ranks and summed.

    `model` is the bare model, not the DDP wrapper (whose forward would wait for a
    matching collective). Under FSDP every forward is collective (it all-gathers the
    parameters), so every rank runs as many batches as rank 0, which has the most
    windows; a rank out of windows scores its first one again and counts nothing. `lead` (the
    model's `<bos>`) goes before every window, as in training (`logits_after_lead`).
    """
    stats = torch.zeros(4, device=device)
    block = samples.block_size
    mine = windows[dist.rank::dist.world_size] * block  # the val windows' start positions
    most = len(windows[0::dist.world_size])
    model.eval()
    with torch.no_grad():
        for start in range(0, most, batch_size):
            batch, counts = mine[start:start + batch_size], 1.0
            if len(batch) == 0:
                batch, counts = windows[:1] * block, 0.0
            x, y = to_batch(samples, batch, block, device)
            with autocast():
                logits = logits_after_lead(model, x, lead)
            stats += counts * rare_weighted_loss(logits, y, is_rare, 0.0)[1]
    model.train()
    dist.all_reduce(stats)
    ce_sum, n, rare_sum, n_rare = stats.tolist()
    nan = float("nan")
    return (ce_sum / n if n else nan), (rare_sum / n_rare if n_rare else nan)
