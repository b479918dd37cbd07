"""`Objective`: the loss `train` optimises, composed from the remedies `loss.*` turns on.

`REMEDIES` is the registry: every remedy class, in the order their hooks run
(rarelm/objectives/remedy.py). It is built from `loss.*` (a `LossParams`) and the
remedies' `Context` alone, and has two paths: the full logits (`_full_loss`) and the hidden
states chunk by chunk (`_chunked_loss`). With no remedy on beyond `loss.rare_weight`, both give
`rare_weighted_loss` (rarelm/objectives/rare_weight.py), the tests' oracle: the same loss,
gradients and logged sums.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from rarelm.errors import RarelmError
from rarelm.objectives.agg import AdaptiveGradientGate
from rarelm.objectives.face import FaceWeights
from rarelm.objectives.focal import Focal
from rarelm.objectives.frequent_unlikelihood import FrequentUnlikelihood
from rarelm.objectives.hidden import HiddenStates
from rarelm.objectives.kl_base import KlToBase
from rarelm.objectives.logit_adjust import LogitAdjustment
from rarelm.objectives.normalize import TargetCountNormalization
from rarelm.objectives.rare_weight import RareWeight, plain_stats, weighted_mean
from rarelm.objectives.remedy import Context, Remedy
from rarelm.objectives.selection import FREQUENT_BUCKET, TargetSelection, rare_mask
from rarelm.objectives.tlat import TlatWeights
from rarelm.objectives.unlikelihood import Unlikelihood
from rarelm.params import LossParams

# KlToBase copies the model in prepare_model: before AdaptiveGradientGate re-routes its output layer
REMEDIES: list[type[Remedy]] = [RareWeight, TlatWeights, FaceWeights, LogitAdjustment, Focal,
                                TargetCountNormalization, Unlikelihood, FrequentUnlikelihood, KlToBase,
                                AdaptiveGradientGate]
_NAMES = {remedy.name for remedy in REMEDIES}


def needs_counts(loss_params: LossParams) -> bool:
    """Whether `loss.*` reads the train token counts (data/rare/counts.npy)."""
    return any(remedy.reads_counts(loss_params) for remedy in REMEDIES)


def _check_counts(params: LossParams, counts) -> None:
    for remedy in REMEDIES:
        what = remedy.reads_counts(params)
        if what and counts is None:
            raise RarelmError(f"{what} needs the train token counts (data/rare/counts.npy); "
                              "run the rare_terms stage first")


class Objective:
    """The loss `train` optimises, per `loss.*` (rarelm/objectives/__init__.py).

    Called with a batch's logits, targets, the train-split positions its windows
    start at (`starts`, int64 [B]) and its input ids (`x`, for the remedies that read the
    context: unlikelihood, KL to the base); the term index turns `starts` into the
    term positions among the targets (`selected`).

    Every `loss.*` value comes from `params` (a `LossParams`) and is held there alone; the
    remedies are built from it and `context` (the rare and frequent buckets, the train `counts`
    where `needs_counts`, `steps_per_epoch` for AGG's memory); `from_params` builds the context
    from buckets. Each remedy that is on is reachable by its name (`objective.face`,
    `objective.agg`; None where off).
    """

    def __init__(self, params: LossParams, context: Context, term_index=None):
        self.params, self.is_rare = params, context.is_rare
        self.selection = TargetSelection(params.targets, context.is_rare, term_index)
        _check_counts(params, context.counts)
        built = (remedy.from_params(params, context) for remedy in REMEDIES)
        self.remedies: list[Remedy] = [remedy for remedy in built if remedy is not None]
        self.uses_selection = any(remedy.uses_selection for remedy in self.remedies)
        self.linear = all(remedy.linear for remedy in self.remedies)
        biased = any(remedy.logit_bias() is not None for remedy in self.remedies)
        # a penalty's chunked form reads the model's own log-sum-exp, which a bias would change
        self.needs_logits = any(remedy.needs_logits for remedy in self.remedies) or (
            biased and not self.linear)

    @classmethod
    def from_params(cls, params: LossParams, buckets, vocab_size: int, device, term_index=None,
                    counts=None, steps_per_epoch: int = 1) -> Objective:
        """The objective of `params` (LossParams) for a model with `vocab_size` outputs."""
        context = Context(rare_mask(buckets, vocab_size).to(device),
                          rare_mask(buckets, vocab_size, FREQUENT_BUCKET).to(device), counts, steps_per_epoch)
        return cls(params, context, term_index)

    def __getattr__(self, name: str):
        if name in _NAMES:
            return next((r for r in self.__dict__.get("remedies", ()) if r.name == name), None)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def selected(self, y: torch.Tensor, starts: np.ndarray) -> torch.Tensor:
        """Bool [B, T]: the targets that weigh 1 + rare_weight (rarelm/objectives/selection.py)."""
        return self.selection(y, starts)

    def prepare_model(self, model) -> None:
        """Once, before DDP or compile wrap the model and before a checkpoint's weights are loaded:
        KL to the base copies it, AGG routes its output layer through the gate."""
        for remedy in self.remedies:
            remedy.prepare_model(model)

    def __call__(self, logits: torch.Tensor | HiddenStates, y: torch.Tensor, starts: np.ndarray,
                 x: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, stats) as `rare_weighted_loss` returns them, for logits [B, T, V] (`_full_loss`)
        or the `HiddenStates` they come from (`_chunked_loss`, unless a remedy needs the full
        logits), targets [B, T] and inputs x [B, T]."""
        if isinstance(logits, HiddenStates):
            if not self.needs_logits:
                return self._chunked_loss(logits, y, starts, x)
            logits = logits.logits()
        for remedy in self.remedies:
            remedy.on_batch(logits, y, x)
        return self._full_loss(logits, y, starts)

    def _full_loss(self, logits: torch.Tensor, y: torch.Tensor, starts: np.ndarray
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits adjusted, per-target loss transformed, weighted mean, penalties added."""
        raw = logits.float().reshape(-1, logits.size(-1))
        targets = y.reshape(-1)
        selected = self.selected(y, starts).reshape(-1) if self.uses_selection else None
        adjusted = raw
        for remedy in self.remedies:
            adjusted = remedy.adjust_logits(adjusted)
        ce = F.cross_entropy(adjusted, targets, reduction="none")
        per_target, weights = ce, None
        for remedy in self.remedies:
            per_target = remedy.transform(per_target)
            weights = remedy.target_weights(weights, targets, selected)
        loss = self._mean(per_target, weights)
        for remedy in self.remedies:
            penalty = remedy.penalty(raw, targets, selected)
            loss = loss if penalty is None else loss + penalty
        # the logged sums are plain cross-entropy of the model's own logits
        plain = ce if adjusted is raw else F.cross_entropy(raw, targets, reduction="none")
        return loss, plain_stats(plain, self.is_rare[targets])

    def _chunked_loss(self, scores: HiddenStates, y: torch.Tensor, starts: np.ndarray, x
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss of `_full_loss` (and of `rare_weighted_loss`) from the hidden states,
        chunk by chunk (rarelm/objectives/linear_ce.py), its gradients made in the same pass:
        the weights first, since no remedy's depend on the logits; a loss linear in the
        per-target CE as sum(coef * ce), any other as a sum over chunks of `row_loss`: the
        transforms (elementwise), the weighted mean's share and the penalties of the chunk's rows."""
        for remedy in self.remedies:
            remedy.on_batch(scores, y, x)
        targets = y.reshape(-1)
        n = targets.numel()
        selected = self.selected(y, starts).reshape(-1) if self.uses_selection else None
        weights = None
        for remedy in self.remedies:
            weights = remedy.target_weights(weights, targets, selected)
        biases = [b for b in (remedy.logit_bias() for remedy in self.remedies) if b is not None]
        bias = sum(biases[1:], biases[0]) if biases else None
        denominator = self._denominator(weights) if weights is not None else n
        if self.linear:  # d loss / d ce_t: w_t / sum(w) (or the remedy's denominator), else 1 / N
            coef = (torch.full((n,), 1.0 / n, device=targets.device) if weights is None
                    else weights / denominator)
            _, _, plain, loss = scores.cross_entropy(targets, bias, coef)
            return loss, plain_stats(plain, self.is_rare[targets])
        inputs = [(remedy, remedy.row_inputs(scores)) for remedy in self.remedies]
        inputs = [(remedy, part) for remedy, part in inputs if part is not None]
        widths = np.cumsum([0] + [part.size(1) for _, part in inputs])
        aux = torch.cat([part for _, part in inputs], dim=1) if inputs else None

        def row_loss(ce, lse, aux_rows, rows):
            per_target = ce
            for remedy in self.remedies:
                per_target = remedy.transform(per_target)
            share = per_target if weights is None else per_target * weights[rows]
            value = share.sum() / denominator
            for (remedy, _), lo, hi in zip(inputs, widths[:-1], widths[1:], strict=True):
                value = value + remedy.row_penalty(lse, aux_rows[:, lo:hi], rows, n)
            for remedy in self.remedies:  # penalties without row inputs
                if remedy not in dict(inputs):
                    penalty = remedy.row_penalty(lse, None, rows, n)
                    value = value if penalty is None else value + penalty
            return value

        _, _, plain, loss = scores.cross_entropy(targets, bias, row_loss=row_loss, aux=aux)
        return loss, plain_stats(plain, self.is_rare[targets])

    def _denominator(self, weights: torch.Tensor) -> torch.Tensor:
        """What sum(w l) is divided by: sum(w), or a remedy's (`loss.normalize`), as `_mean`."""
        for remedy in self.remedies:
            denominator = remedy.denominator(weights)
            if denominator is not None:
                return denominator
        return weights.sum().clamp_min(1e-12)

    def _mean(self, per_target: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
        """sum(w l) / sum(w), or over the denominator a remedy sets (`loss.normalize`)."""
        for remedy in self.remedies:
            denominator = remedy.denominator(weights)
            if denominator is not None:
                return (per_target * weights).sum() / denominator
        return weighted_mean(per_target, weights)

    def step_end(self, done: int, dist=None) -> None:
        """After optimizer step `done`: FACE sums its counts over the ranks (and refreshes), AGG
        moves the step into its window."""
        all_reduce = dist.all_reduce if dist is not None else (lambda t: None)
        for remedy in self.remedies:
            remedy.on_step_end(done, all_reduce)

    def state(self) -> dict:
        """This rank's objective state for a checkpoint (CPU tensors, weights_only-loadable)."""
        states = ((remedy.name, remedy.state()) for remedy in self.remedies)
        return {name: state for name, state in states if state is not None}

    def load_state(self, state: dict | None) -> None:
        state = state or {}
        for remedy in self.remedies:
            if remedy.name in state:
                remedy.load_state(state[remedy.name])
