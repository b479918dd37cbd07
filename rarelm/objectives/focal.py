"""Focal loss (Lin et al. 2017): `loss.focal_gamma` (0: off, cross-entropy)."""

from __future__ import annotations

import torch

from rarelm.objectives.remedy import Context, Remedy
from rarelm.params import LossParams


def focal(ce: torch.Tensor, gamma: float) -> torch.Tensor:
    """Focal loss (Lin et al. 2017) from cross-entropy: (1 - p_t)^gamma * ce, p_t = exp(-ce).

    gamma = 0 is cross-entropy. Worked example, p_t = 0.5 (ce = log 2 = 0.693), gamma = 2:
    0.5^2 * 0.693 = 0.173; a well-predicted p_t = 0.9 (ce 0.105) keeps 0.01 * 0.105.

    >>> [round(x, 4) for x in focal(-torch.log(torch.tensor([0.5, 0.9])), 2.0).tolist()]
    [0.1733, 0.0011]
    """
    return (-torch.expm1(-ce)).pow(gamma) * ce


class Focal(Remedy):
    """Each target's loss scaled down by how well it is already predicted."""

    name = "focal"

    def __init__(self, gamma: float):
        self.gamma = gamma

    @classmethod
    def from_params(cls, params: LossParams, context: Context) -> Focal | None:
        return cls(params.focal_gamma) if params.focal_gamma > 0 else None

    def transform(self, loss: torch.Tensor) -> torch.Tensor:
        return focal(loss, self.gamma)
