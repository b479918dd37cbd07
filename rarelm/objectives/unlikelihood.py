"""Token-level unlikelihood (Welleck et al., ICLR 2020), as published: `loss.unlikelihood` (0: off).

At every target the model is also pushed away from the tokens of its previous context,
the repetitions that maximum likelihood over-produces:

    C_t  = {x_<t} \\ {x_t}                          (the context's tokens, minus the target)
    UL_t = -sum_{c in C_t} log(1 - p(c | x_<t))
    loss = CE + unlikelihood * sum_t UL_t / n_targets

Source: Welleck, Kulikov, Roller, Dinan, Cho, Weston, "Neural text generation with
unlikelihood training", ICLR 2020, eq. 4 and the token-level objective of section 5.1
(candidates "prev_context" in the authors' fairseq criterion,
github.com/facebookresearch/unlikelihood_training, custom/candidate_penalty_ce_loss.py,
which also clamps 1 - p at 1e-5). The context is the window: for target y_j = x_{j+1}
it is x_0 .. x_j. Worked example, window x = (0, 1, 2), targets y = (1, 2, 1): C = {0},
{0, 1}, {0, 2}; with p = 0.5, 0.3, 0.2 at every position, UL = -log 0.5, -log 0.5 -
log 0.7, -log 0.5 - log 0.8, summed 2.659. The repo's earlier variant (frequent-bucket
negatives ranked above the target, at the selected targets) is `loss.frequent_unlikelihood`
(rarelm/objectives/frequent_unlikelihood.py).
"""

from __future__ import annotations

import torch

from rarelm.objectives.remedy import Context, Remedy
from rarelm.params import LossParams


def context_negatives(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Bool [B, T, T]: context token x_i is a negative of target j (i <= j, x_i != y_j), each distinct
    token once (at its first position in the window).

    A [B, T, T] mask over context positions rather than [B, T, V] over the vocabulary: a window
    has at most T distinct tokens.

    >>> context_negatives(torch.tensor([[0, 1, 2]]), torch.tensor([[1, 2, 1]])).int().tolist()
    [[[1, 0, 0], [1, 1, 0], [1, 0, 1]]]
    >>> context_negatives(torch.tensor([[5, 5]]), torch.tensor([[5, 7]])).int().tolist()  # 5 once
    [[[0, 0], [1, 0]]]
    """
    t = x.size(1)
    earlier = torch.ones(t, t, dtype=torch.bool, device=x.device).tril(-1)  # [i, k]: k < i
    first = ~((x[:, :, None] == x[:, None, :]) & earlier).any(-1)  # [B, i]: no earlier x_k == x_i
    causal = earlier | torch.eye(t, dtype=torch.bool, device=x.device)  # [j, i]: i <= j
    return causal[None] & first[:, None, :] & (x[:, None, :] != y[:, :, None])


def unlikelihood(logits: torch.Tensor, x: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
    """sum_j sum_{i negative} -log(1 - p_j(x_i)) for logits [B, T, V], inputs x [B, T] and
    `context_negatives` [B, T, T].

    >>> logits = torch.log(torch.tensor([0.5, 0.3, 0.2])).expand(1, 3, 3)
    >>> x, y = torch.tensor([[0, 1, 2]]), torch.tensor([[1, 2, 1]])
    >>> round(unlikelihood(logits, x, context_negatives(x, y)).item(), 4)
    2.6593
    """
    z = logits.float()
    # log p_j(x_i) from the T context columns and each row's log-sum-exp: no [B, T, V] softmax
    at_context = z.gather(2, x[:, None, :].expand(-1, x.size(1), -1))  # [B, j, i]: z_j(x_i)
    return context_penalty(at_context - torch.logsumexp(z, -1, keepdim=True), negatives)


def context_penalty(log_p: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
    """sum over the negatives of -log(1 - p), from log p [B, T, T] (1 - p clamped at 1e-5, as the
    authors' criterion does).

    >>> log_p, negatives = torch.log(torch.tensor([[[0.5, 0.3]]])), torch.tensor([[[True, True]]])
    >>> round(context_penalty(log_p, negatives).item(), 4)
    1.0498
    """
    return -(torch.log((1.0 - log_p.exp()).clamp_min(1e-5)) * negatives).sum()


class Unlikelihood(Remedy):
    """Welleck et al.'s token-level unlikelihood, previous-context negatives, at every target."""

    name = "unlikelihood"

    def __init__(self, weight: float):
        self.weight = weight
        self.x = self.negatives = None

    @classmethod
    def from_params(cls, params: LossParams, context: Context) -> Unlikelihood | None:
        return cls(params.unlikelihood) if params.unlikelihood > 0 else None

    def on_batch(self, logits, y, x) -> None:
        if x is None:
            raise RuntimeError("loss.unlikelihood needs the input ids: call the objective with x")
        self.x, self.negatives = x, context_negatives(x, y)

    def penalty(self, logits, targets, selected):
        batched = logits.reshape(*self.x.shape, logits.size(-1))
        return self.weight * unlikelihood(batched, self.x, self.negatives) / targets.numel()

    def row_inputs(self, scores):
        """From the hidden states: each target's T context logits z_j(x_i) [N, T], not V."""
        return scores.logits_at(self.x).reshape(-1, self.x.size(1))

    def row_penalty(self, lse, inputs, rows, n_targets):
        negatives = self.negatives.reshape(-1, self.x.size(1))[rows]
        return self.weight * context_penalty(inputs - lse[:, None], negatives) / n_targets
