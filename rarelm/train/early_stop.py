"""Early stopping on validation loss and the best weights (`train.early_stop_patience`, `train.keep_best`).

A plain fine-tune of a fixed length is undertrained on a large corpus and overfitted on a small one;
stopped on validation loss it is the baseline at its best, whatever the corpus size. After each
validation (every `train.eval_every` steps and at the last step) `after_validation` compares val_ce
with the best so far: lower is a new best (its step and loss; with `keep_best` its weights are
kept, in the run's checkpoint folder, so a resumed run still has them); not lower is one more
stale validation, and `early_stop_patience` stale validations in a row stop the run there (0:
never). With `keep_best` the saved model is the best validation's weights (`restore_best`).
The learning-rate schedule stays the one of `train.max_steps`: stopping cuts it short.

val_ce 3.0, 2.5, 2.6, 2.55 at steps 100-400 with patience 2: the best is step 200, and the run
stops after step 400 (two validations without a lower loss):

    >>> best = Best()
    >>> [best.update(s, v) for s, v in ((100, 3.0), (200, 2.5), (300, 2.6), (400, 2.55))]  # new best?
    [True, True, False, False]
    >>> best.stale, best.step, best.val_ce, best.should_stop(patience=2)
    (2, 200, 2.5, True)
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

import torch

from rarelm.errors import RarelmError


@dataclasses.dataclass
class Best:
    """The lowest val_ce so far, its step, the validations since, and where the run stopped."""

    step: int | None = None
    val_ce: float | None = None
    stale: int = 0  # validations since the best without a lower val_ce
    stopped_at: int | None = None  # the step early stopping ended the run at (None: it ran to the end)

    def update(self, step: int, val_ce: float) -> bool:
        """Account for a validation; True if it is a new best. A NaN loss (no val windows) changes nothing."""
        if math.isnan(val_ce):
            return False
        if self.val_ce is None or val_ce < self.val_ce:
            self.step, self.val_ce, self.stale = step, val_ce, 0
            return True
        self.stale += 1
        return False

    def should_stop(self, patience: int) -> bool:
        return patience > 0 and self.stale >= patience


def after_validation(t, done: int) -> bool:
    """After the validation at step `done` (every rank: val_ce is reduced over the ranks, so all
    decide alike): update the best, keep its weights if asked; True = stop the run here."""
    tp = t.tp
    if not (tp.early_stop_patience or tp.keep_best):
        return False
    best = Best(**t.state.best)
    if best.update(done, t.state.val["val_ce"]) and tp.keep_best:
        _save_weights(_weights_path(t), done, t.raw_model)
    stop = best.should_stop(tp.early_stop_patience) and done < tp.max_steps
    if stop:
        best.stopped_at = done
    t.state.best = dataclasses.asdict(best)
    return stop


def last_step(t) -> int:
    """The step the run ended at: where early stopping stopped it, else train.max_steps."""
    return t.state.best.get("stopped_at") or t.tp.max_steps


def restore_best(t) -> None:
    """With keep_best, put the best validation's weights back into the model before it is saved."""
    best = Best(**t.state.best)
    if not t.tp.keep_best or best.step is None or best.step == last_step(t):
        return  # the model as it is: the last step is the best (or nothing was validated)
    path = _weights_path(t)
    saved = torch.load(path, weights_only=True, map_location="cpu") if path.is_file() else {}
    if saved.get("step") != best.step:
        raise RarelmError(f"{path}: the weights of the best validation (step {best.step}) are missing; "
                          "remove the run's checkpoints and train again")
    with torch.no_grad():
        for name, tensor in t.raw_model.state_dict().items():
            mine, kept = _local(tensor), saved["weights"].get(name)
            if kept is None or kept.shape != mine.shape:  # e.g. resumed with another number of processes
                raise RarelmError(f"{path}: the best validation's weights do not fit this run's model "
                                  f"({name}); remove the run's checkpoints and train again")
            mine.copy_(kept)


def metrics(t) -> dict:
    """metrics/train.json's early-stopping figures (only when early_stop_patience or keep_best is on)."""
    tp = t.tp
    if not (tp.early_stop_patience or tp.keep_best):
        return {}
    best = Best(**t.state.best)
    saved = best.step if tp.keep_best and best.step is not None else last_step(t)
    epoch_tokens = len(t.inputs.train_samples) * t.params.model.block_size
    return {"best_val_step": best.step, "best_val_ce": best.val_ce,
            "best_val_ppl": math.exp(best.val_ce) if best.val_ce is not None else None,
            "stopped_early": best.stopped_at is not None, "saved_step": saved,
            # passes over the train windows up to the saved weights (at this run's tokens per step)
            "saved_epochs": round(saved * t.tokens_per_step / epoch_tokens, 3)}


def _local(tensor):
    """This rank's part of a (possibly FSDP-sharded) tensor."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _weights_path(t) -> Path:
    return Path(t.store.dir) / f"best-rank{t.dist.rank}.pt"


def _save_weights(path: Path, step: int, model) -> None:
    """This rank's weights (its shards under FSDP) at `step`, written atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    weights = {name: _local(tensor).detach().cpu().clone() for name, tensor in model.state_dict().items()}
    tmp = path.with_suffix(".tmp")
    torch.save({"step": step, "weights": weights}, tmp)
    os.replace(tmp, path)
