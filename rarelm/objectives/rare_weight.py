"""The baseline objective: cross-entropy with weight 1 + `loss.rare_weight` on the selected targets.

Each selected target (`loss.targets`, rarelm/objectives/selection.py) gets weight
w_t = 1 + rare_weight, every other target 1; the loss is sum(w_t * ce_t) / sum(w_t),
so rare_weight = 0 is plain mean cross-entropy. Worked example with three targets,
cross-entropies 1.0, 3.0 and 2.0, the second in the rare bucket, the second and
third tokens of a term, and rare_weight = 2:

    rare_bucket: (1 * 1.0 + 3 * 3.0 + 1 * 2.0) / (1 + 3 + 1) = 2.4
    terms, both: (1 * 1.0 + 3 * 3.0 + 3 * 2.0) / (1 + 3 + 3) = 16 / 7 = 2.2857
    plain mean:  2.0

Cross-entropy is computed in float32 whatever the autocast dtype of the logits,
since bf16 rounds losses around 3 to steps of 1/64.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rarelm.objectives.remedy import Context, Remedy
from rarelm.params import LossParams


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
    weights = None
    if rare_weight:
        weights = rare_weights(rare if selected is None else selected.reshape(-1), rare_weight)
    return weighted_mean(ce, weights), plain_stats(ce, rare)


def rare_weights(selected: torch.Tensor, rare_weight: float) -> torch.Tensor:
    """Float32 [N]: 1 + rare_weight where `selected`, else 1.

    >>> rare_weights(torch.tensor([False, True]), 2.0).tolist()
    [1.0, 3.0]
    """
    return 1.0 + rare_weight * selected.float()


def times_token_weight(weights: torch.Tensor | None, token_weight: torch.Tensor,
                       targets: torch.Tensor) -> torch.Tensor:
    """token_weight[y_t] * w_t for targets [N] (w = None: all 1).

    >>> times_token_weight(torch.tensor([1.0, 3.0]), torch.tensor([2.0, 0.5]), torch.tensor([1, 0])).tolist()
    [0.5, 6.0]
    """
    return token_weight[targets] * (1.0 if weights is None else weights)


def weighted_mean(loss: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """sum(w_t * l_t) / sum(w_t), the plain mean where `weights` is None; all-zero weights give 0.

    >>> weighted_mean(torch.tensor([1.0, 3.0, 2.0]), torch.tensor([1.0, 3.0, 1.0])).item()
    2.4000000953674316
    """
    if weights is None:
        return loss.mean()
    return (loss * weights).sum() / weights.sum().clamp_min(1e-12)


def plain_stats(ce: torch.Tensor, rare: torch.Tensor) -> torch.Tensor:
    """Detached float32 [ce_sum, tokens, rare_ce_sum, rare_tokens] of per-target CE [N], rare [N]."""
    with torch.no_grad():
        # the count as a fill on the device, not a tensor copied from the host (a GPU sync)
        return torch.stack([ce.sum(), torch.full((), float(ce.numel()), device=ce.device),
                            (ce * rare).sum(), rare.sum().float()])


class RareWeight(Remedy):
    """`loss.rare_weight` on the targets `loss.targets` selects (0: off)."""

    name, uses_selection = "rare_weighting", True

    def __init__(self, rare_weight: float):
        self.rare_weight = rare_weight

    @classmethod
    def from_params(cls, params: LossParams, context: Context) -> RareWeight | None:
        return cls(params.rare_weight) if params.rare_weight else None

    def target_weights(self, weights, targets, selected):
        mine = rare_weights(selected, self.rare_weight)
        return mine if weights is None else weights * mine
