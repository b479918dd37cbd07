"""KL to the frozen base model on the unselected targets: `loss.kl_base` (0: off).

Fine-tuning toward the terms moves the whole next-token distribution, and overall
perplexity pays (issue 22: +31% on real text). This penalty holds the model's
distribution to the starting model's wherever the target is not one `loss.targets`
selects (with `loss.targets: terms`: every non-term target), leaving the term positions
free:

    KL_t = sum_v p_base(v | x_<t) * (log p_base(v | x_<t) - log p(v | x_<t))
    loss = weighted CE + kl_base * sum_{t not selected} KL_t / n_targets

Direction: KL(base || model), the forward KL of distillation (Hinton et al. 2015) and
of Learning without Forgetting (Li & Hoiem, ECCV 2016), which keep a fine-tuned network's
outputs on old inputs close to the original network's. It is mass-covering: the model is
penalised wherever the base puts probability it drops, which is what overall perplexity
measures, while the reverse KL(model || base) of RLHF (Ouyang et al. 2022) lets the model
drop base modes at no cost. Its gradient in the logits is p - p_base: cross-entropy against
the base's soft targets. Worked example, two tokens, p_base = (0.5, 0.5), p = (0.25, 0.75):
KL = 0.5 log(0.5 / 0.25) + 0.5 log(0.5 / 0.75) = 0.3466 - 0.2027 = 0.1438.

The base is the run's starting model (`model.name_or_path`, or the fresh initialisation
when there is none: then the penalty pulls toward a random model, which is not useful):
`prepare_model` copies it once, before a checkpoint's weights are loaded (so a resumed
run has the same base), in eval mode without gradients, in float32 weights like the
model; its forward runs under the autocast dtype of the model's logits, i.e. the
training precision. Cost: one extra forward of the base per micro-batch (no backward) and a
soft-target cross-entropy over the vocabulary, and a second copy of the weights in memory. On the
committed base model (width 128, 8,192 tokens, so the output layer and softmaxes dominate) a step
took 1.8-2.0x a plain one's CPU time (`python bench/objective_step_cost.py`), far over the 10% issue
22 hoped for, and 2.2-2.3x since the plain step's loss is chunked over tokens (issue 44; the KL
needs the full logits of the model and the base, so its own time did not change); on wider
models the extra forward tends to a third of a step.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from rarelm.objectives.remedy import Context, Remedy
from rarelm.params import LossParams


def kl_from_base(logits: torch.Tensor, base_logits: torch.Tensor) -> torch.Tensor:
    """KL(p_base || p) per row, float32 [N], for logits and base logits [N, V].

    >>> base, mine = torch.log(torch.tensor([[0.5, 0.5]])), torch.log(torch.tensor([[0.25, 0.75]]))
    >>> round(kl_from_base(mine, base).item(), 4)
    0.1438
    """
    with torch.no_grad():  # the base's side: constants of the gradient
        log_base = torch.log_softmax(base_logits.float(), dim=-1)
        p_base = log_base.exp()
        entropy = -(p_base * log_base).sum(-1)
    # cross-entropy against the base's soft targets minus their entropy: one pass over the logits
    # with a gradient instead of three
    return F.cross_entropy(logits.float(), p_base, reduction="none") - entropy


class KlToBase(Remedy):
    """kl_base * sum of KL(base || model) over the unselected targets, per target."""

    name, uses_selection = "kl_base", True

    def __init__(self, weight: float):
        self.weight = weight
        self.base = None
        self.base_logits: torch.Tensor | None = None

    @classmethod
    def from_params(cls, params: LossParams, context: Context) -> KlToBase | None:
        return cls(params.kl_base) if params.kl_base > 0 else None

    def prepare_model(self, model) -> None:
        """Freeze a copy of the starting model (before AGG or DDP wrap the model)."""
        self.base = copy.deepcopy(model).eval().requires_grad_(False)

    def on_batch(self, logits, y, x) -> None:
        if x is None or self.base is None:
            raise RuntimeError("loss.kl_base needs the starting model (prepare_model) and the input "
                               "ids: call the objective with x")
        half = logits.dtype in (torch.bfloat16, torch.float16)  # the training forward's autocast
        with torch.no_grad(), torch.autocast(x.device.type, dtype=logits.dtype, enabled=half):
            self.base_logits = self.base(input_ids=x, use_cache=False).logits
        self.base_logits = self.base_logits.reshape(-1, logits.size(-1))

    def penalty(self, logits, targets, selected):
        kl = kl_from_base(logits, self.base_logits)
        kept = kl if selected is None else kl * ~selected
        return self.weight * kept.sum() / targets.numel()
