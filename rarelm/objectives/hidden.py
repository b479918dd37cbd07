"""`HiddenStates`: a batch's scores as the model's last hidden states and its output matrix.

The training step hands the objective these instead of logits where the model's logits are
exactly its output layer applied to its hidden states (rarelm.train.output): the per-target
losses then come from `linear_cross_entropy` chunk by chunk (rarelm/objectives/linear_ce.py)
and the full [B, T, V] logits are never made, unless a remedy asks for them (`logits()`).

    scores = HiddenStates(hidden, head.weight, torch.bfloat16)   # hidden [B, T, d]
    ce, lse, plain, weighted = scores.cross_entropy(y.reshape(-1), coef=weights)
    context = scores.logits_at(x)                                 # [B, T, T]: z_j(x_i)

>>> scores = HiddenStates(torch.ones(1, 2, 2), torch.eye(3, 2), None)
>>> scores.logits().tolist(), scores.logits_at(torch.tensor([[2, 0]])).tolist()
([[[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]]], [[[0.0, 1.0], [0.0, 1.0]]])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rarelm.objectives.linear_ce import linear_cross_entropy


class HiddenStates:
    """hidden [B, T, d] and the output matrix weight [V, d]; `dtype` the matmuls' dtype (the
    training autocast's, None: the hidden states' own), as the output layer would run them;
    `mm(a, b)` the chunked loss's products (None: torch's)."""

    def __init__(self, hidden: torch.Tensor, weight: torch.Tensor, dtype=None, mm=None):
        dtype = dtype or hidden.dtype
        self.hidden, self.weight = hidden.to(dtype), weight.to(dtype)  # differentiable casts
        self.mm = mm  # the loss's products a @ b (None: torch's; rarelm.train.matmul.mm)

    @property
    def shape(self) -> torch.Size:
        """The shape the logits would have: [B, T, V]."""
        return torch.Size([*self.hidden.shape[:-1], self.weight.size(0)])

    def logits(self) -> torch.Tensor:
        """The full logits [B, T, V] in the compute dtype, for a remedy that needs all of them."""
        return F.linear(self.hidden, self.weight)

    def cross_entropy(self, targets: torch.Tensor, bias: torch.Tensor | None = None,
                      coef: torch.Tensor | None = None, row_loss=None, aux: torch.Tensor | None = None):
        """(ce, lse, plain, weighted) of targets [N] = B * T (rarelm.objectives.linear_ce)."""
        return linear_cross_entropy(self.hidden.reshape(-1, self.hidden.size(-1)), self.weight,
                                    targets, bias, coef, row_loss, aux, mm=self.mm)

    def logits_at(self, ids: torch.Tensor) -> torch.Tensor:
        """Float32 [B, T, K]: the logit of token ids[b, k] at every position t of window b
        (the context's tokens, for unlikelihood): K output rows per window, not V."""
        rows = F.embedding(ids, self.weight)  # [B, K, d]
        return torch.bmm(self.hidden, rows.transpose(1, 2)).float()
