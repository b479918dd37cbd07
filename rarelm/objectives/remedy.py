"""The one protocol every remedy follows, and what `from_params` gets to build one.

A remedy is a small class; `Objective` calls each hook of every remedy that is on,
in the order of `REMEDIES` (rarelm/objectives/objective.py). Every hook has a
neutral default here, so a remedy writes only the hooks it needs:

    reads_counts(params)   the setting that makes it read the train counts, or ""
    from_params(params, context) -> the remedy, or None where its params turn it off
    prepare_model(model)   once, before DDP / compile wrap the model (the starting model: pretrained
                           or freshly initialised, before a checkpoint's weights are loaded)
    on_batch(logits, y, x) every micro-batch, before the loss (x: the input ids [B, T], or None)
    adjust_logits(z)       float32 logits [N, V] -> the logits the cross-entropy sees
    transform(loss)        per-target loss [N] -> per-target loss [N], elementwise
    target_weights(w, targets, selected)   per-target weights [N] (None = all 1) times its own
    denominator(weights)   what sum(w_t * l_t) is divided by (None: sum(w_t), or N where w is None)
    penalty(z, targets, selected)          a scalar added to the weighted mean
    logit_bias()           a float32 [V] added to every row of logits (adjust_logits' chunked form)
    row_inputs(scores)     per-target inputs [N, K] its row_penalty reads, from `HiddenStates`
                           (rarelm/objectives/hidden.py), e.g. K logits per row; or None
    row_penalty(lse, inputs, rows, n_targets)   penalty's chunked form: the penalty of the targets
                           `rows` (a slice) from their log-sum-exp and their rows of row_inputs
    on_step_end(done, all_reduce)          after optimizer step `done`
    state() / load_state(state)            its checkpointed state (None = nothing to keep)

`uses_selection` says whether it reads the selected targets (`loss.targets`);
`needs_logits` whether it needs the full [N, V] logits (by default: where it adjusts logits
or adds a penalty without the chunked form of that hook); the objective then makes them,
else it never does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import torch

from rarelm.params import LossParams


@dataclasses.dataclass(frozen=True)
class Context:
    """What a remedy may be built from besides `loss.*`: the model's output vocabulary."""

    is_rare: torch.Tensor  # bool [V]: rare bucket
    is_frequent: torch.Tensor  # bool [V]: frequent bucket
    counts: np.ndarray | None = None  # int [V] train token counts, where a remedy reads them
    steps_per_epoch: int = 1

    @property
    def device(self) -> torch.device:
        return self.is_rare.device

    @property
    def vocab_size(self) -> int:
        return len(self.is_rare)


class Remedy:
    """Base of every remedy: each hook leaves the objective as it is."""

    name: str = ""  # its key in `Objective.state()` and its attribute (`objective.face`)
    uses_selection: bool = False

    @classmethod
    def reads_counts(cls, params: LossParams) -> str:
        return ""

    @property
    def needs_logits(self) -> bool:
        """Whether this remedy needs the full logits (its hooks have no chunked form)."""
        return (_overrides(self, "adjust_logits") and not _overrides(self, "logit_bias")) or \
            (_overrides(self, "penalty") and not _overrides(self, "row_penalty"))

    @property
    def linear(self) -> bool:
        """Whether the loss stays a weighted sum of per-target cross-entropies with it: no
        transform, no penalty (the chunked loss then computes its gradients in one pass)."""
        return not (_overrides(self, "transform") or _overrides(self, "penalty")
                    or _overrides(self, "row_penalty"))

    @classmethod
    def from_params(cls, params: LossParams, context: Context) -> Remedy | None:
        raise NotImplementedError

    def prepare_model(self, model) -> None:
        pass

    def on_batch(self, logits: torch.Tensor, y: torch.Tensor, x: torch.Tensor | None) -> None:
        pass

    def adjust_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    def transform(self, loss: torch.Tensor) -> torch.Tensor:
        return loss

    def target_weights(self, weights: torch.Tensor | None, targets: torch.Tensor,
                       selected: torch.Tensor | None) -> torch.Tensor | None:
        return weights

    def denominator(self, weights: torch.Tensor | None) -> torch.Tensor | None:
        return None

    def penalty(self, logits: torch.Tensor, targets: torch.Tensor,
                selected: torch.Tensor | None) -> torch.Tensor | None:
        return None

    def logit_bias(self) -> torch.Tensor | None:
        return None

    def row_inputs(self, scores) -> torch.Tensor | None:
        return None

    def row_penalty(self, lse: torch.Tensor, inputs: torch.Tensor | None, rows: slice,
                    n_targets: int) -> torch.Tensor | None:
        return None

    def on_step_end(self, done: int, all_reduce: Callable[[torch.Tensor], None]) -> None:
        pass

    def state(self) -> dict | None:
        return None

    def load_state(self, state: dict) -> None:
        pass


def _overrides(remedy: Remedy, hook: str) -> bool:
    """Whether `remedy`'s class defines `hook` itself rather than the neutral default here."""
    return getattr(type(remedy), hook) is not getattr(Remedy, hook)
