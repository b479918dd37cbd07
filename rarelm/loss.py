"""Rare-token loss weighting: cross-entropy that counts rare-bucket targets more.

Each target token t gets weight w_t = 1 + rare_weight * [t is in the rare
bucket]; the loss is sum(w_t * ce_t) / sum(w_t), so rare_weight = 0 is plain
mean cross-entropy. Worked example with two targets, the second rare, their
cross-entropies 1.0 and 3.0 and rare_weight = 2:

    (1 * 1.0 + 3 * 3.0) / (1 + 3) = 2.5          (plain mean: 2.0)

Cross-entropy is computed in float32 whatever the autocast dtype of the
logits, since bf16 rounds losses around 3 to steps of 1/64.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

RARE_BUCKET = 2  # data/rare/buckets.npy: 0 frequent, 1 medium, 2 rare, 3 unseen


def rare_mask(buckets, vocab_size: int) -> torch.Tensor:
    """Bool [vocab_size]: True for token ids in the rare bucket (ids past the buckets: False)."""
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    b = torch.from_numpy(np.array(buckets[:vocab_size], dtype=np.int64))
    mask[:len(b)] = b == RARE_BUCKET
    return mask


def rare_weighted_loss(logits: torch.Tensor, targets: torch.Tensor, is_rare: torch.Tensor,
                       rare_weight: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted loss to optimise, and detached sums for logging.

    logits [B, T, V] (any float dtype), targets [B, T] (next tokens), is_rare [V] bool.
    Returns (loss, stats) with stats = [ce_sum, tokens, rare_ce_sum, rare_tokens]
    in float32, so plain CE = ce_sum / tokens and rare CE = rare_ce_sum / rare_tokens
    can be summed over micro-batches and ranks before dividing.

    >>> logits = torch.log(torch.tensor([[[0.5, 0.5], [0.25, 0.75]]]))
    >>> loss, stats = rare_weighted_loss(logits, torch.tensor([[0, 1]]),
    ...                                  torch.tensor([False, True]), 2.0)
    >>> round(loss.item(), 4), [round(s, 4) for s in stats.tolist()]
    (0.389, [0.9808, 2.0, 0.2877, 1.0])
    """
    vocab = logits.size(-1)
    ce = F.cross_entropy(logits.float().reshape(-1, vocab), targets.reshape(-1), reduction="none")
    rare = is_rare[targets.reshape(-1)]
    if rare_weight:
        weights = 1.0 + rare_weight * rare.float()
        loss = (ce * weights).sum() / weights.sum()
    else:
        loss = ce.mean()
    with torch.no_grad():
        stats = torch.stack([ce.sum(), torch.tensor(float(ce.numel()), device=ce.device),
                             (ce * rare).sum(), rare.sum().float()])
    return loss, stats
