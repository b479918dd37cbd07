"""The training loop: one process per device under torchrun, read top to bottom.

In the spirit of nanoGPT's train.py and torchtitan's `train()`, everything a training
run does is visible in `train()` below: set up (rarelm.train.setup: process group and
device, model, optionally with LoRA adapters (rarelm.train.lora), DDP or FSDP2
(`train.strategy`, rarelm.train.sharding), AdamW with warmup and cosine decay, mixed
precision), then for each step `train_step` (rarelm.train.step: gradient accumulation
that reduces gradients over the ranks only on the last micro-step, clipping), the curve
meter, periodic validation, logging, and sharded checkpoints (rarelm.train.checkpoint)
that let a killed run resume bit-identically; then the outputs (rarelm.train.saving).

    torchrun --standalone --nproc-per-node 2 -m stages.train     # what dvc.yaml runs
    python -m stages.train                                        # the same (it launches torchrun)

Data: windows of `model.block_size + 1` train tokens drawn by the weighted sampler
(rarelm.train.batches, rarelm.train.sampler), from data/weights/weights.npy, or with
`weights.schedule: decay | grow` recomputed each epoch from data/weights/scores.npy at
that epoch's alpha (`rarelm.weights.alpha_at`). The loss is `rarelm.objectives.objective.Objective`
(`loss.*`); the loop calls its `prepare_model` once, `step_end` after each optimizer
step, and checkpoints its per-rank `state`.
"""

from __future__ import annotations

import time
from typing import Any

from rarelm.params import Params
from rarelm.train import early_stop, setup
from rarelm.train.inputs import Paths
from rarelm.train.meter import Meter
from rarelm.train.optim import lr_at, set_lr
from rarelm.train.report import progress_bar, report, start_line
from rarelm.train.saving import finish
from rarelm.train.state import rank_state
from rarelm.train.step import train_step
from rarelm.train.validate import validation_loss


def train(params: Params, paths: Paths = Paths(), progress: bool = True) -> dict[str, Any] | None:
    """Train, write models/model, metrics and curves; the metrics on rank 0, None elsewhere."""
    tp = params.train
    t = setup.start(params, paths)
    bar = None
    try:
        setup.build(t)
        bar = progress_bar(t.dist.main and progress, tp.max_steps, t.start_step)
        if t.dist.main:
            bar.console.print(start_line(t))  # what runs the step: precision, kernels, device
        if t.found and t.dist.main:
            bar.console.print(f"train: resuming from {t.found} (step {t.start_step})")
        meter = Meter(t.device, tp.max_steps, t.saved_window)
        t.session_t0, t.session_step = time.perf_counter(), t.start_step
        clock = (t.session_t0, t.start_step)  # the log lines' time so far and time left
        for step in range(t.start_step, tp.max_steps):
            lr = lr_at(step, tp)
            set_lr(t.optimizer, lr)
            grad_norm = train_step(t, meter, step)
            done = step + 1
            row: dict[str, Any] = {}
            if _due(done, tp.log_every, tp) or _due(done, tp.checkpoint_every, tp):
                meter.stop_if_diverged(t.dist)  # before it is logged or saved
            if _due(done, tp.log_every, tp):
                row = meter.row(done, lr, grad_norm, t.tokens_per_step, t.dist)
            stop = False
            if _due(done, tp.eval_every, tp):
                row.update(step=done, **validate(t))
                meter.restart_clock()  # validation time is not training throughput
                stop = early_stop.after_validation(t, done)  # train.early_stop_patience, keep_best
            report(t, bar, row, done, clock)
            if stop:
                break
            if done % tp.checkpoint_every == 0 and done < tp.max_steps:
                save_checkpoint(t, meter, done)
        if tp.max_steps == 0:  # no step: the starting (pretrained) model as it is, validated once
            validate(t)
        early_stop.restore_best(t)  # train.keep_best: the best validation's weights are saved
        metrics = finish(t)
        t.run.finish("FINISHED")
        return metrics
    except BaseException:
        t.run.finish("FAILED")
        raise
    finally:
        if bar is not None:
            bar.stop()
        t.dist.close()


def _due(done: int, every: int, tp) -> bool:
    """Whether step `done` is one of every `every` steps, or the last."""
    return done % every == 0 or done == tp.max_steps


def validate(t: setup.Trainer) -> dict[str, float]:
    """The val losses, also kept in the run's state for the final metrics."""
    val_ce, val_rare = validation_loss(t.raw_model, t.inputs.val_samples, t.val_idx,
                                       t.tp.batch_size, t.device, t.precision.autocast,
                                       t.is_rare, t.dist, t.inputs.lead)
    t.state.val = {"val_ce": val_ce, "val_rare_ce": val_rare}
    return dict(t.state.val)


def save_checkpoint(t: setup.Trainer, meter: Meter, done: int) -> None:
    """Checkpoint step `done` (every rank): the run's state, and every rank's own part."""
    t.state.step, t.state.run_id = done, t.run.run_id
    t.state.add_session(done, t.session_t0, t.session_step, t.tokens_per_step)
    t.session_t0, t.session_step = time.perf_counter(), done
    ranks = t.dist.gather(rank_state(t.stream, t.objective, meter.state()))
    t.store.save(done, t.raw_model, t.optimizer,
                 {**t.state.as_dict(), "scaler": t.scaler.state_dict(), "ranks": ranks}, t.dist)
