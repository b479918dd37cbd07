"""FACE, frequency-aware cross-entropy (Jiang et al. 2019, arXiv 1902.09191): `loss.token_weight: face`.

Like TLAT (rarelm/objectives/tlat.py) a weight per target token, but from relative
frequencies that training keeps counting: of the targets (`loss.face_source:
targets`) or of the model's argmax predictions (`predictions`), refreshed every
`loss.face_refresh` steps.
"""

from __future__ import annotations

import numpy as np
import torch

from rarelm.objectives.rare_weight import times_token_weight
from rarelm.objectives.remedy import Context, Remedy
from rarelm.params import LossParams


def face_weights(counts: torch.Tensor) -> torch.Tensor:
    """FACE's pre-weights (Jiang et al. 2019, arXiv 1902.09191), float32 [V], mean 1.

    RF_v = count_v / sum(count) (relative frequency), w_v = 1 - RF_v / max(RF)
    (a = -1 / max RF: the most frequent token weighs 0, an unseen one 1), then
    normalised to mean 1 over the vocabulary: w_v * V / sum(w). Worked example,
    counts 6, 3, 1, 0: RF = 0.6, 0.3, 0.1, 0; w = 0, 0.5, 0.833, 1; sum 2.333;
    times 4 / 2.333:

    >>> [round(w, 3) for w in face_weights(torch.tensor([6, 3, 1, 0])).tolist()]
    [0.0, 0.857, 1.429, 1.714]
    """
    rf = counts.double() / counts.sum().clamp_min(1)
    w = 1.0 - rf / rf.max().clamp_min(1e-300)
    return (w * len(w) / w.sum().clamp_min(1e-300)).float()


class FaceWeights(Remedy):
    """FACE's frequencies, counted as training goes and turned into weights every `refresh` steps.

    The counts start from the train counts (so weights exist from step 0); each step
    adds the frequencies of the targets (`source: targets`) or of the model's argmax
    predictions (`source: predictions`) of every micro-batch, summed over the DDP
    ranks at the step's end; every `refresh` steps the weights are recomputed from the
    counts (`face_weights`). Its state (counts, weights) goes into the checkpoint.
    """

    name = "face"

    def __init__(self, counts, source: str, refresh: int, device=None):
        self.source, self.refresh = source, refresh
        self.counts = torch.as_tensor(np.asarray(counts, dtype=np.int64)).to(device)
        self.pending = torch.zeros_like(self.counts)
        self.weights = face_weights(self.counts)

    @classmethod
    def reads_counts(cls, params: LossParams) -> str:
        return "loss.token_weight = face" if params.token_weight == "face" else ""

    @classmethod
    def from_params(cls, params: LossParams, context: Context) -> FaceWeights | None:
        if params.token_weight != "face":
            return None
        return cls(context.counts, params.face_source, params.face_refresh, context.device)

    @property
    def needs_logits(self) -> bool:
        return self.source == "predictions"  # the argmax of every row

    def on_batch(self, logits: torch.Tensor, y: torch.Tensor, x) -> None:
        with torch.no_grad():
            seen = y if self.source == "targets" else logits.detach().argmax(-1)
            self.pending += torch.bincount(seen.reshape(-1), minlength=len(self.counts))

    def target_weights(self, weights, targets, selected):
        return times_token_weight(weights, self.weights, targets)

    def on_step_end(self, done: int, all_reduce) -> None:
        all_reduce(self.pending)
        self.counts += self.pending
        self.pending.zero_()
        if done % self.refresh == 0:
            self.weights = face_weights(self.counts)

    def state(self) -> dict:
        return {"counts": self.counts.cpu(), "weights": self.weights.cpu()}

    def load_state(self, state: dict) -> None:
        self.counts = state["counts"].to(self.counts.device)
        self.weights = state["weights"].to(self.weights.device)
        self.pending = torch.zeros_like(self.counts)
