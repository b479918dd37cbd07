"""Token-level unlikelihood (Welleck et al., ICLR 2020): `loss.unlikelihood` (0: off).

At the selected targets (`loss.targets`) it pushes down the frequent tokens the
model ranks above the target: loss += unlikelihood * sum_t UL_t / n_targets.
"""

from __future__ import annotations

import torch

from rarelm.objectives.remedy import Context, Remedy
from rarelm.params import LossParams


def unlikelihood(logits: torch.Tensor, targets: torch.Tensor, selected: torch.Tensor,
                 candidates: torch.Tensor) -> torch.Tensor:
    """Token-level unlikelihood (Welleck et al., ICLR 2020), summed over the selected targets.

    At each selected target t, the negative candidates C_t are the tokens of `candidates`
    (the frequent bucket) whose logit is above the target's; UL_t = -sum_{c in C_t}
    log(1 - p_c), with p the model's own softmax (float32). logits [N, V], targets,
    selected [N]. Worked example, p = 0.5, 0.3, 0.2, target 2, token 0 frequent, 1 not:
    C = {0}, UL = -log(1 - 0.5) = 0.693.

    >>> logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    >>> round(unlikelihood(logits, torch.tensor([2]), torch.tensor([True]),
    ...                    torch.tensor([True, False, False])).item(), 4)
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


class Unlikelihood(Remedy):
    """The unlikelihood penalty at the selected targets, against the frequent bucket."""

    name, uses_selection = "unlikelihood", True

    def __init__(self, weight: float, is_frequent: torch.Tensor):
        self.weight, self.is_frequent = weight, is_frequent

    @classmethod
    def from_params(cls, params: LossParams, context: Context) -> Unlikelihood | None:
        return cls(params.unlikelihood, context.is_frequent) if params.unlikelihood > 0 else None

    def penalty(self, logits, targets, selected):
        return self.weight * unlikelihood(logits, targets, selected, self.is_frequent) / targets.numel()
