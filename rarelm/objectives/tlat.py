"""Token-level adaptive training (TLAT, Gu et al., EMNLP 2020): `loss.token_weight: tlat_exp | tlat_chi2`.

Every target is weighted by its token's weight from the train counts, times the
weight of `loss.rare_weight`: w_t = (1 + rare_weight * selected_t) * token_weight[y_t].
"""

from __future__ import annotations

import numpy as np
import torch

from rarelm.objectives.rare_weight import times_token_weight
from rarelm.objectives.remedy import Context, Remedy
from rarelm.params import LossParams

FORMS = ("tlat_exp", "tlat_chi2")


def tlat_weights(counts, form: str, a: float, t: float) -> torch.Tensor:
    """Token-level adaptive training (Gu et al., EMNLP 2020): float32 [V] weight per token.

    With c = Count / median(Count of the tokens seen in train), as the authors' code
    normalises it (github.com/ictnlp/TLAT-NMT, criterions/label_smoothed_cross_entropy.py):

        tlat_exp:  f(c) = exp(-T * c)
        tlat_chi2: f(c) = c^2 * exp(-T * c)
        w = 1 + A * f(c) / max f

    (max over the tokens seen in train), so weights run from 1 (frequent tokens) to
    1 + A (the most favoured seen token; an unseen one gets at most that); the paper's
    `A * f + 1` with f scaled to a maximum of 1, which the code fixes at A = e - 1.
    The exponential form favours the rarest tokens most, the chi-square form peaks at
    c = 2 / T and gives very rare tokens less. Worked example, counts 1, 2, 4 (median 2:
    c = 0.5, 1, 2), A = 1, T = 1:

        exp:  f = 0.607, 0.368, 0.135 -> w = 1 + f / 0.607 = 2.0, 1.607, 1.223
        chi2: f = 0.152, 0.368, 0.541 -> w = 1 + f / 0.541 = 1.280, 1.680, 2.0

    >>> [round(w, 3) for w in tlat_weights(np.array([1, 2, 4]), "tlat_exp", 1.0, 1.0).tolist()]
    [2.0, 1.607, 1.223]
    >>> [round(w, 3) for w in tlat_weights(np.array([1, 2, 4]), "tlat_chi2", 1.0, 1.0).tolist()]
    [1.28, 1.68, 2.0]
    """
    counts = np.asarray(counts, dtype=np.float64)
    seen = counts[counts > 0]
    c = counts / (np.median(seen) if len(seen) else 1.0)
    f = np.exp(-t * c) if form == "tlat_exp" else c ** 2 * np.exp(-t * c)
    top = f[counts > 0].max() if len(seen) else 1.0  # unseen tokens (never targets) do not set it
    return torch.from_numpy(1.0 + a * np.minimum(f / max(top, 1e-300), 1.0)).float()


class TlatWeights(Remedy):
    """The TLAT weight of each target's token (fixed: from the train counts)."""

    name = "tlat"

    def __init__(self, weights: torch.Tensor):
        self.weights = weights

    @classmethod
    def reads_counts(cls, params: LossParams) -> str:
        return f"loss.token_weight = {params.token_weight}" if params.token_weight in FORMS else ""

    @classmethod
    def from_params(cls, params: LossParams, context: Context) -> TlatWeights | None:
        if params.token_weight not in FORMS:
            return None
        weights = tlat_weights(context.counts, params.token_weight, params.tlat_a, params.tlat_t)
        return cls(weights.to(context.device))

    def target_weights(self, weights, targets, selected):
        return times_token_weight(weights, self.weights, targets)
