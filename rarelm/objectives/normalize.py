"""Weighted loss over the number of targets: `loss.normalize: targets` (weights: as before).

The weighted mean sum(w_t l_t) / sum(w_t) shrinks every unselected target's share as
`loss.rare_weight` grows: raising the term weight quietly lowers the learning rate of
the general text. Divided by the number of targets N instead,

    loss = sum_t w_t * l_t / N

every unselected target (w_t = 1) keeps exactly its plain-CE share 1 / N and the
selected ones add on top. Worked example, cross-entropies 1, 3, 2, the second and third
targets selected, rare_weight 2 (w = 1, 3, 3): sum(w l) = 16; weights: 16 / 7 = 2.2857,
the first target's share 1 / 7; targets: 16 / 3 = 5.3333, its share 1 / 3, as in plain
CE (6 / 3 = 2.0). The loss (so the gradient's size) grows with the term weight; gradient
clipping (`train.grad_clip`) still bounds a step. Source: the "sum" rather than the
"weighted mean" reduction of a weighted loss (PyTorch's `CrossEntropyLoss(weight=...)`
divides by sum(w), the choice this undoes).
"""

from __future__ import annotations

import torch

from rarelm.objectives.remedy import Context, Remedy
from rarelm.params import LossParams


class TargetCountNormalization(Remedy):
    """Divide the weighted sum by the number of targets (not by the weights' sum)."""

    name = "normalize"

    @classmethod
    def from_params(cls, params: LossParams, context: Context) -> TargetCountNormalization | None:
        return cls() if params.normalize == "targets" else None

    def denominator(self, weights: torch.Tensor | None) -> torch.Tensor | None:
        # a fill, not a copy from the host: no wait for the GPU inside the step
        return None if weights is None else torch.full((), float(weights.numel()), device=weights.device)
