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


def context_negatives(x: torch.Tensor, y: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Bool [B, T, V]: token v is a negative of target j, i.e. among x_0 .. x_j and not y_j.

    >>> context_negatives(torch.tensor([[0, 1, 2]]), torch.tensor([[1, 2, 1]]), 3).int().tolist()
    [[[1, 0, 0], [1, 1, 0], [1, 0, 1]]]
    """
    seen = torch.zeros(*x.shape, vocab_size, dtype=torch.uint8, device=x.device)
    seen.scatter_(2, x[..., None], 1)
    seen = seen.cummax(dim=1).values.bool()  # seen at or before position j
    return seen.scatter(2, y[..., None], False)


def unlikelihood(logits: torch.Tensor, negatives: torch.Tensor) -> torch.Tensor:
    """sum_t sum_{c in C_t} -log(1 - p_c) for logits [N, V] and negatives [N, V] (bool).

    >>> logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]])).expand(3, 3)
    >>> negatives = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]]).bool()
    >>> round(unlikelihood(logits, negatives).item(), 4)
    2.6593
    """
    p = torch.softmax(logits.float(), dim=-1)
    return -(torch.log((1.0 - p).clamp_min(1e-5)) * negatives).sum()


class Unlikelihood(Remedy):
    """Welleck et al.'s token-level unlikelihood, previous-context negatives, at every target."""

    name = "unlikelihood"

    def __init__(self, weight: float, vocab_size: int):
        self.weight, self.vocab_size = weight, vocab_size
        self.negatives: torch.Tensor | None = None

    @classmethod
    def from_params(cls, params: LossParams, context: Context) -> Unlikelihood | None:
        return cls(params.unlikelihood, context.vocab_size) if params.unlikelihood > 0 else None

    def on_batch(self, logits, y, x) -> None:
        if x is None:
            raise RuntimeError("loss.unlikelihood needs the input ids: call the objective with x")
        self.negatives = context_negatives(x, y, logits.size(-1)).reshape(-1, logits.size(-1))

    def penalty(self, logits, targets, selected):
        return self.weight * unlikelihood(logits, self.negatives) / targets.numel()
