"""One optimizer step: `train_step` runs `grad_accum` micro-steps of `forward_backward_step`,
then clips, steps and zeroes the gradients.

Gradient accumulation: DDP and FSDP reduce gradients over the ranks only on the last
micro-step (`sharding.gradient_sync`); each micro-step's loss is divided by
`grad_accum`, so 4 micro-batches of 2 windows give the gradient of one batch of 8.
Mixed precision: the forward under autocast (bf16 / fp16), the loss in fp32, and under
fp16 a GradScaler that skips steps whose gradients overflowed. The output layer: where the
model and objective allow it, the forward stops at the last hidden states and the objective
computes the loss chunk by chunk from them and the output matrix (rarelm.train.output).
"""

from __future__ import annotations

import numpy as np
import torch

from rarelm.train import sharding
from rarelm.train.batches import logits_after_lead, to_batch
from rarelm.train.meter import Meter
from rarelm.train.setup import Trainer


def forward_backward_step(t: Trainer, starts: np.ndarray, last: bool):
    """Forward and backward of the windows at `starts`; (loss, objective stats)."""
    x, y = to_batch(t.stream.tokens, starts, t.params.model.block_size, t.device)  # what starts address
    with sharding.gradient_sync(t.model, last):
        with t.precision.autocast(), t.output.hidden_states():  # rarelm.train.output
            scores = t.output.scores(logits_after_lead(t.model, x, t.inputs.lead), t.precision.dtype)
        loss, stats = t.objective(scores, y, starts, x)
        t.scaler.scale(loss / t.tp.grad_accum).backward()
    return loss, stats


def train_step(t: Trainer, meter: Meter, step: int):
    """Optimizer step `step` (0-based) at the learning rate already set; its gradient norm."""
    tp = t.tp
    for micro in range(tp.grad_accum):
        starts = t.stream.take(tp.batch_size)  # where this micro-batch's windows begin
        loss, stats = forward_backward_step(t, starts, last=micro == tp.grad_accum - 1)
        meter.add(stats, loss)
    t.scaler.unscale_(t.optimizer)  # true gradient norm, also under fp16 loss scaling
    grad_norm = torch.nn.utils.clip_grad_norm_(
        t.raw_model.parameters(), tp.grad_clip if tp.grad_clip > 0 else float("inf"))
    if not t.precision.use_scaler:  # fp16: the GradScaler skips steps with non-finite gradients
        meter.check_finite(step, grad_norm)
    t.scaler.step(t.optimizer)  # skips the step if fp16 gradients overflowed
    t.scaler.update()
    if step == t.start_step:  # gradients and AdamW state exist now: what this rank holds
        t.state_bytes = max(t.dist.gather(sharding.state_bytes(t.raw_model, t.optimizer)) or [0])
    t.optimizer.zero_grad(set_to_none=True)
    t.objective.step_end(step + 1, t.dist)  # FACE: counts summed over ranks; AGG: its window
    meter.end_step()
    return grad_norm
