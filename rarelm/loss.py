"""The training objective: cross-entropy that counts the selected targets more.

`loss.targets` selects which targets count more:

* rare_bucket: the target token is in the rare frequency bucket (data/rare/buckets.npy);
* terms: the target position is a token of an extracted term's occurrence
  (data/rare/term_index.npy), so every token of "myocardial infarction"
  counts, including a medium-frequency modifier, and a number or a one-off
  word does not;
* both: either.

Each selected target gets weight w_t = 1 + rare_weight, every other target 1;
the loss is sum(w_t * ce_t) / sum(w_t), so rare_weight = 0 is plain mean
cross-entropy. Worked example with three targets, cross-entropies 1.0, 3.0 and
2.0, the second in the rare bucket, the second and third tokens of a term, and
rare_weight = 2:

    rare_bucket: (1 * 1.0 + 3 * 3.0 + 1 * 2.0) / (1 + 3 + 1) = 2.4
    terms, both: (1 * 1.0 + 3 * 3.0 + 3 * 2.0) / (1 + 3 + 3) = 16 / 7 = 2.2857
    plain mean:  2.0

`Objective` is the one entry point the training loop calls; a new way of
weighting targets is a new `targets` choice in `Objective.selected`.
Cross-entropy is computed in float32 whatever the autocast dtype of the logits,
since bf16 rounds losses around 3 to steps of 1/64.
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
                       rare_weight: float, selected: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Weighted loss to optimise, and detached sums for logging.

    logits [B, T, V] (any float dtype), targets [B, T] (next tokens), is_rare [V] bool;
    `selected` [B, T] bool: the targets that weigh 1 + rare_weight (default: the rare ones).
    Returns (loss, stats) with stats = [ce_sum, tokens, rare_ce_sum, rare_tokens]
    in float32 (always of the rare bucket), so plain CE = ce_sum / tokens and rare CE =
    rare_ce_sum / rare_tokens can be summed over micro-batches and ranks before dividing.

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
        chosen = rare if selected is None else selected.reshape(-1)
        weights = 1.0 + rare_weight * chosen.float()
        loss = (ce * weights).sum() / weights.sum()
    else:
        loss = ce.mean()
    with torch.no_grad():
        stats = torch.stack([ce.sum(), torch.tensor(float(ce.numel()), device=ce.device),
                             (ce * rare).sum(), rare.sum().float()])
    return loss, stats


class Objective:
    """The loss `train` optimises, per `loss.*` (module docstring).

    Called with a batch's logits, targets and the train-split positions its
    windows start at (`starts`, int64 [B]); the term index turns those into the
    term positions among the targets.

        >>> from rarelm.rare import TermIndex
        >>> index = TermIndex(np.array([[2, 2, 0]]), max_length=2)  # a term on positions 2, 3
        >>> is_rare = torch.tensor([False, False, True])          # token 2 is in the rare bucket
        >>> y = torch.tensor([[2, 0, 1]])                          # targets at positions 1, 2, 3
        >>> [Objective(t, 2.0, is_rare, index).selected(y, np.array([0])).tolist()
        ...  for t in ("rare_bucket", "terms", "both")]
        [[[True, False, False]], [[False, True, True]], [[True, True, True]]]
    """

    def __init__(self, targets: str, rare_weight: float, is_rare: torch.Tensor, term_index=None):
        if targets not in ("rare_bucket", "terms", "both"):
            raise ValueError(f"loss.targets = {targets!r}")
        if targets != "rare_bucket" and term_index is None:
            raise ValueError(f"loss.targets = {targets} needs the term index")
        self.targets, self.rare_weight = targets, rare_weight
        self.is_rare, self.term_index = is_rare, term_index

    def selected(self, y: torch.Tensor, starts: np.ndarray) -> torch.Tensor:
        """Bool [B, T]: the targets that weigh 1 + rare_weight."""
        rare = self.is_rare[y]
        if self.targets == "rare_bucket":
            return rare
        terms = torch.from_numpy(self.term_index.target_mask(starts, y.size(1))).to(y.device)
        return terms if self.targets == "terms" else terms | rare

    def __call__(self, logits: torch.Tensor, y: torch.Tensor, starts: np.ndarray
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.rare_weight:
            return rare_weighted_loss(logits, y, self.is_rare, 0.0)
        return rare_weighted_loss(logits, y, self.is_rare, self.rare_weight, self.selected(y, starts))
