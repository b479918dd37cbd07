"""Logit-adjusted cross-entropy (Menon et al., ICLR 2021): `loss.logit_adjust_tau` (0: off).

The loss sees p = softmax(logits + tau * log pi), pi the train unigram prior
(`rarelm.artifacts.buckets.log_prior`); the logged cross-entropy stays that of the model's own
logits. Worked example: two tokens with equal logits, counts 2 and 0 (add-one prior
3/4, 1/4), tau = 1: the adjusted softmax is the prior, so the loss of target 1 is
-log 0.25 = 1.386 where plain cross-entropy is log 2 = 0.693.
"""

from __future__ import annotations

import torch

from rarelm.artifacts.buckets import log_prior
from rarelm.objectives.remedy import Context, Remedy
from rarelm.params import LossParams


class LogitAdjustment(Remedy):
    """Adds tau * log pi to every row of logits before the cross-entropy.

    >>> import numpy as np
    >>> adjust = LogitAdjustment.from_params(LossParams(logit_adjust_tau=1.0),
    ...                                      Context(torch.zeros(2, dtype=torch.bool),
    ...                                              torch.zeros(2, dtype=torch.bool), np.array([2, 0])))
    >>> [round(p, 4) for p in torch.softmax(adjust.adjust_logits(torch.zeros(1, 2)), -1)[0].tolist()]
    [0.75, 0.25]
    """

    name = "logit_adjust"

    def __init__(self, scaled_log_prior: torch.Tensor):
        self.log_prior = scaled_log_prior

    @classmethod
    def reads_counts(cls, params: LossParams) -> str:
        tau = params.logit_adjust_tau
        return f"loss.logit_adjust_tau = {tau}" if tau > 0 else ""

    @classmethod
    def from_params(cls, params: LossParams, context: Context) -> LogitAdjustment | None:
        if params.logit_adjust_tau <= 0:
            return None
        scaled = params.logit_adjust_tau * log_prior(context.counts)
        return cls(torch.from_numpy(scaled).float().to(context.device))

    def adjust_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits + self.log_prior

    def logit_bias(self) -> torch.Tensor:
        return self.log_prior
