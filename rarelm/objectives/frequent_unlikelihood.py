"""Frequent-token unlikelihood: `loss.frequent_unlikelihood` (0: off). Not Welleck et al.'s.

The unlikelihood penalty of Welleck et al. (ICLR 2020) with other negatives: at the selected
targets (`loss.targets`) it pushes down the frequent tokens the model ranks above the target:
loss += frequent_unlikelihood * sum_t UL_t / n_targets. This was `loss.unlikelihood` until
issue 22 (the demo headline's `unlikelihood` row of README was run with it); the published
token-level form, previous-context negatives at every target, is `loss.unlikelihood`
(rarelm/objectives/unlikelihood.py).
"""

from __future__ import annotations

import torch

from rarelm.objectives.remedy import Context, Remedy
from rarelm.params import LossParams


def frequent_unlikelihood(logits: torch.Tensor, targets: torch.Tensor, selected: torch.Tensor,
                          candidates: torch.Tensor) -> torch.Tensor:
    """Unlikelihood of the frequent tokens ranked above the target, summed over the selected targets.

    At each selected target t, the negative candidates C_t are the tokens of `candidates`
    (the frequent bucket) whose logit is above the target's; UL_t = -sum_{c in C_t}
    log(1 - p_c), with p the model's own softmax (float32). logits [N, V], targets,
    selected [N]. Worked example, p = 0.5, 0.3, 0.2, target 2, token 0 frequent, 1 not:
    C = {0}, UL = -log(1 - 0.5) = 0.693.

    >>> logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    >>> round(frequent_unlikelihood(logits, torch.tensor([2]), torch.tensor([True]),
    ...                             torch.tensor([True, False, False])).item(), 4)
    0.6931
    """
    rows = selected.nonzero().squeeze(1)
    if rows.numel() == 0:
        return logits.float().sum() * 0.0  # keeps the graph (and DDP) the same every step
    z = logits[rows].float()
    above = z > z.gather(1, targets[rows, None])
    negative = above & candidates[None, :]
    p = torch.softmax(z, dim=-1).masked_fill(~negative, 0.0)
    return -torch.log1p(-p.clamp(max=1.0 - 1e-6)).sum()


class FrequentUnlikelihood(Remedy):
    """The unlikelihood penalty at the selected targets, against the frequent bucket."""

    name, uses_selection = "frequent_unlikelihood", True

    def __init__(self, weight: float, is_frequent: torch.Tensor):
        self.weight, self.is_frequent = weight, is_frequent

    @classmethod
    def from_params(cls, params: LossParams, context: Context) -> FrequentUnlikelihood | None:
        weight = params.frequent_unlikelihood
        return cls(weight, context.is_frequent) if weight > 0 else None

    def penalty(self, logits, targets, selected):
        ul = frequent_unlikelihood(logits, targets, selected, self.is_frequent)
        return self.weight * ul / targets.numel()
