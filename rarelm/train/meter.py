"""The training curves: each rank's sums since the last row, averaged over all ranks per row.

A row (plots/train.csv, MLflow `train/*`) averages the steps since the previous one:

    loss = sum of micro-step losses / micro-steps      ce = sum of target CEs / targets
    rare_ce = sum of rare-target CEs / rare targets    tokens_per_s = steps * tokens per step / s

e.g. two micro-steps with losses 2.0 and 3.0 give a row loss of 2.5. The sums travel in
checkpoints (`state`), so a run resumed between two rows writes the same next row.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from rarelm.train import sharding
from rarelm.train.dist import EveryRankError


class Meter:
    """This rank's curve sums (ce, tokens, rare ce, rare tokens; loss, micro-steps) since the
    last row, the steps and seconds they took, and the first step whose loss or gradient norm
    was not finite (kept on the device: no sync per step)."""

    def __init__(self, device, max_steps: int, saved: dict[str, Any] | None = None):
        self.window = torch.zeros(4, device=device)  # ce_sum, tokens, rare_ce_sum, rare_tokens
        self.loss = torch.zeros(2, device=device)  # loss sum, micro-steps
        self.t0, self.steps = time.perf_counter(), 0
        self.max_steps = max_steps
        if saved is not None:  # the steps since the last row before the checkpoint
            self.window += saved["sums"][:4].to(device)
            self.loss += saved["sums"][4:].to(device)
            self.steps, self.t0 = saved["steps"], self.t0 - saved["seconds"]
        # the first step with a non-finite loss or gradient norm (none: max_steps + 1)
        self.first_bad = torch.full((), max_steps + 1, dtype=torch.long, device=device)

    def add(self, stats, loss) -> None:
        """One micro-step's objective stats and loss."""
        self.window += stats
        self.loss += torch.stack([loss.detach(), torch.ones((), device=self.loss.device)])

    def check_finite(self, step: int, grad_norm) -> None:
        """Note step + 1 as the first bad one if the loss or the gradient norm is not finite."""
        finite = torch.isfinite(self.loss[0]) & torch.isfinite(sharding.local(grad_norm))
        self.first_bad = torch.where(finite, self.first_bad, self.first_bad.clamp(max=step + 1))

    def end_step(self) -> None:
        self.steps += 1

    def stop_if_diverged(self, dist) -> None:
        """Raise an EveryRankError, on every rank alike, if any rank saw a non-finite loss or
        gradient norm."""
        found = self.first_bad.detach().clone()
        dist.all_reduce(found, op="min")
        if int(found) <= self.max_steps:
            raise EveryRankError(
                f"step {int(found)}: the loss or gradient norm is not finite (training diverged); "
                "no model written: lower train.lr, set train.grad_clip, or check the pretrained model")

    def row(self, done: int, lr: float, grad_norm, tokens_per_step: int, dist) -> dict[str, Any]:
        """The curve row of step `done`, averaged over every rank's tokens; starts a new window."""
        sums = torch.cat([self.window, self.loss])
        dist.all_reduce(sums)
        ce_sum, n, rare_sum, n_rare, loss_sum, n_loss = sums.tolist()
        elapsed = time.perf_counter() - self.t0
        row = {"step": done, "loss": loss_sum / n_loss, "ce": ce_sum / n,
               "rare_ce": rare_sum / n_rare if n_rare else float("nan"), "lr": lr,
               "grad_norm": float(sharding.whole(grad_norm)),
               "tokens_per_s": self.steps * tokens_per_step / elapsed}
        self.window.zero_()
        self.loss.zero_()
        self.t0, self.steps = time.perf_counter(), 0
        return row

    def restart_clock(self) -> None:
        """Validation time is not training throughput."""
        self.t0 = time.perf_counter()

    def state(self) -> dict[str, Any]:
        """This rank's sums since the last row, for a checkpoint taken between two rows: the
        resumed run's next row then averages the same steps as an uninterrupted run's (a
        checkpoint every 5 steps, a row every 4: the row of step 12 holds steps 9-12 however
        the run was interrupted at step 10)."""
        return {"sums": torch.cat([self.window, self.loss]).detach().cpu(), "steps": self.steps,
                "seconds": time.perf_counter() - self.t0}
