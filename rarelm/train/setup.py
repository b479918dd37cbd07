"""Everything a training run sets up before its first step, in one `Trainer`.

    t = start(params, paths)   # process group, precision, inputs, checkpoint, MLflow run
    build(t)                   # model, objective, optimizer, sample stream; resumed if a checkpoint

Determinism: `torch.use_deterministic_algorithms(True)`, the model initialised from
`seed` on every rank, then per-rank RNG seeds derived from `seed`; every piece of
state that a later step depends on is in the checkpoint (rarelm.train.state).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rarelm.objectives.objective import Objective
from rarelm.objectives.selection import rare_mask
from rarelm.params import Params, TrainParams
from rarelm.process import exit_on_sigterm
from rarelm.tracking.metrics import upstream_metrics
from rarelm.tracking.run import Run, start_run
from rarelm.train import sharding
from rarelm.train.batches import (
    SampleStream,
    epochs_to_train,
    sampling_weights,
    to_batch,
    val_windows,
    with_replay,
)
from rarelm.train.checkpoint import CheckpointStore
from rarelm.train.dist import Dist
from rarelm.train.inputs import Inputs, Paths, checkpoint_key, load_inputs
from rarelm.train.matmul import mm, pick_backend, route_linear_layers
from rarelm.train.model import build_model, for_windows, provenance
from rarelm.train.optim import configure_optimizer
from rarelm.train.output import output_layer
from rarelm.train.precision import (
    Precision,
    cached_probe,
    deterministic,
    machine_cache,
    pick_precision,
    probe_key,
    probe_seconds,
    resolve,
)
from rarelm.train.sampler import WeightedDistributedSampler
from rarelm.train.state import RunState, resume_ranks, seed_everything

UPSTREAM_STAGES = ["prepare", "tokenize", "rare_terms", "weights"]


@dataclasses.dataclass
class Trainer:
    """One training run's parts: what `start` finds, then what `build` makes (None until then)."""

    params: Params
    paths: Paths
    dist: Dist
    precision: Precision
    inputs: Inputs
    pinned: dict[str, str]  # hub commits the run starts from (rarelm.train.model.provenance)
    store: CheckpointStore
    found: str  # the checkpoint this run resumes from, or ""
    state: RunState
    saved: dict[str, Any]  # the rest of the checkpoint's state dict (scaler, ranks, world size)
    run: Any  # the MLflow run (rarelm.tracking.run.Run; inert on ranks other than 0)
    model: Any = None  # what the loop calls: DDP-wrapped, FSDP-sharded and/or compiled
    raw_model: Any = None  # the model underneath, which is saved and checkpointed
    is_rare: Any = None  # bool [vocab]: the rare bucket
    objective: Any = None
    output: Any = None  # what the step hands the objective: logits or hidden states (output.py)
    optimizer: Any = None
    scaler: Any = None
    stream: SampleStream | None = None
    val_idx: Any = None  # the val windows validation scores
    saved_window: dict[str, Any] | None = None  # the curve sums since the checkpoint's last row
    upstream: dict[str, float] = dataclasses.field(default_factory=dict)  # logged with the first row
    start_step: int = 0  # the step this session starts at (the checkpoint's, or 0)
    session_t0: float = 0.0  # perf_counter at the session's start or its last checkpoint
    session_step: int = 0  # the step then: tokens trained = those before + this session's
    state_bytes: int = 0  # parameters + gradients + optimizer state on the fullest rank
    matmul: tuple[str, str] = ("mkl", "")  # fp32 products' backend and why (rarelm.train.matmul)

    @property
    def tp(self) -> TrainParams:
        return self.params.train

    @property
    def device(self):
        return self.dist.device

    @property
    def tokens_per_step(self) -> int:
        tp = self.tp
        return tp.batch_size * self.params.model.block_size * tp.grad_accum * self.dist.world_size


def start(params: Params, paths: Paths) -> Trainer:
    """The process group, precision and inputs; the newest intact checkpoint of exactly these
    params + data, if any; the MLflow run (rank 0), connecting in the background."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
    dist = Dist.setup()
    sharding.check_world_size(params.train.strategy, dist.world_size)
    deterministic(params.train.compile, dist.device)
    inputs = load_inputs(params, paths)
    precision = _precision(params, dist, inputs, machine_cache())
    pinned = provenance(params.model, inputs.data)  # hub commits: a new revision is a new run
    store = CheckpointStore(paths.cache, checkpoint_key(params, paths, pinned))
    found = dist.broadcast(str(store.latest_valid() or "") if dist.main else None)
    saved = store.load_state(Path(found)) if found else {}
    state = RunState.from_dict(saved) if found else RunState()
    run = Run("train", "", "")  # inert on other ranks
    if dist.main:
        run = start_run(params, stage="train", run_id=state.run_id, background=True,
                                 inputs=[paths.tokenized, paths.rare, paths.weights])
        # torchrun stops the other workers with SIGTERM when one fails: end the run as FAILED.
        signal.signal(signal.SIGTERM, exit_on_sigterm)
    return Trainer(params, paths, dist, precision, inputs, pinned, store, found, state, saved, run)


def _precision(params: Params, dist: Dist, inputs: Inputs, cache: Path) -> Precision:
    """`train.precision` on this device, and why: rank 0 resolves it (with `auto` on a CPU with
    native bf16, by timing this run's model in fp32 and bf16, cached) and every rank trains in
    its answer."""
    answer = None
    if dist.main:
        chosen = resolve(params.train.precision, dist.device,
                         lambda: _probe(params, inputs, dist.device, cache))
        answer = (chosen.name, chosen.reason, chosen.probe)
    name, reason, probe = dist.broadcast(answer)
    return Precision(*pick_precision(name, dist.device), dist.device, reason, probe)


def _probe(params: Params, inputs: Inputs, device, cache: Path) -> dict[str, Any]:
    """Seconds per forward + backward step of this run's model at its micro-batch, fp32 and
    bf16 (rarelm.train.precision.probe_seconds), from the cache if this CPU, torch, model shape
    and micro-batch were timed before. Its fp32 side runs the products as fp32 training would
    (oneDNN where rarelm.train.matmul measures it faster): timed by MKL, fp32 lost to bf16 on a
    CPU where oneDNN makes it the faster. The RNGs are left as they were."""
    with torch.random.fork_rng(devices=[]):
        model = build_model(params.model, inputs.data).to(device).train()
        backend, _ = pick_backend(model, device, cache, _may_route(params.train))
        if backend == "onednn":
            route_linear_layers(model)  # bf16 autocast steps run the layers' own forward
        block, samples = params.model.block_size, inputs.train_samples
        starts = np.arange(params.train.batch_size) % len(samples) * block
        x, y = to_batch(samples, starts, block, device)
        return cached_probe(cache, probe_key(model, tuple(x.shape), backend),
                            lambda: probe_seconds(model, x, y))


def build(t: Trainer) -> None:
    """Model, objective, optimizer, grad scaler and sample stream, put back from the checkpoint
    if `t.found`; then the model in train mode, ready for the first step."""
    params, tp, inputs, dist = t.params, t.tp, t.inputs, t.dist
    t.start_step = t.state.step
    seed_everything(params.seed)  # the same initial weights on every rank
    # whole windows: attention with no mask built (no host sync a step on a GPU)
    model = for_windows(build_model(params.model, inputs.data), params.model.block_size + len(inputs.lead))
    model = model.to(t.device)
    t.raw_model = model  # what we save and checkpoint, whatever wraps it below
    if tp.gradient_checkpointing:
        model.activation_checkpointing_enable(  # transformers 5's name for it
            activation_checkpointing_kwargs={"use_reentrant": False})
    t.is_rare = rare_mask(inputs.buckets, model.get_input_embeddings().num_embeddings).to(t.device)
    per_rank = -(-len(inputs.train_samples) // dist.world_size)
    steps_per_epoch = -(-per_rank // (tp.batch_size * tp.grad_accum))  # AGG's memory
    t.objective = Objective.from_params(params.loss, inputs.buckets, len(t.is_rare), t.device,
                                        inputs.term_index, inputs.counts, steps_per_epoch)
    t.objective.prepare_model(t.raw_model)  # AGG: gate the output layer's gradient
    t.matmul = _matmul(t, model)  # fp32 on a CPU: oneDNN where faster (rarelm.train.matmul)
    # the loss from the hidden states chunk by chunk, where the objective and the model allow it
    t.output = output_layer(t.raw_model, chunked=not t.objective.needs_logits
                            and tp.strategy != "fsdp", mm=functools.partial(mm, backend=t.matmul[0]))
    # DDP wraps the model; FSDP2 shards it in place (so raw_model is sharded too), before
    # the optimizer is built on its parameters: AdamW's state then exists per shard only.
    t.model = sharding.wrap(model, tp.strategy, dist, t.precision.dtype)
    t.optimizer = configure_optimizer(t.model, tp, t.device)
    t.scaler = torch.amp.GradScaler(t.device.type, enabled=t.precision.use_scaler)
    t.stream = SampleStream(_sampler(t), inputs.train_samples.tokens)  # start positions of windows
    # train.replay_share > 0: a share of every batch's rows from general text (rarelm.train.replay)
    t.stream = with_replay(t.stream, params, inputs.replay, dist.world_size, dist.rank)
    t.val_idx = val_windows(len(inputs.val_samples), tp.eval_batches * tp.batch_size)
    if t.found:
        t.store.load_weights(Path(t.found), t.raw_model, t.optimizer)
        t.scaler.load_state_dict(t.saved.pop("scaler"))
        t.saved_window = resume_ranks(t.saved.pop("ranks"), t.saved.pop("world_size"), t.start_step,
                                      params.seed, dist, t.stream, t.objective)
    else:
        seed_everything(params.seed * 1000 + dist.rank)  # per-rank dropout, reproducibly
    # Logged with the first step metrics, so that connecting has had time to finish.
    if not t.start_step:
        t.upstream = upstream_metrics(t.paths.metrics_dir, UPSTREAM_STAGES)
    if tp.compile:
        t.model = torch.compile(t.model)
    t.run.require()  # a store that cannot log (tracking.required): one line before any step
    t.model.train()


def _may_route(tp) -> bool:
    """Whether fp32 products may go through oneDNN: not under FSDP (sharded weights) or compile
    (it traces the model's own forward)."""
    return tp.strategy != "fsdp" and not tp.compile


def _matmul(t: Trainer, model) -> tuple[str, str]:
    """The fp32 products' backend, chosen on rank 0 (measured once per machine and shape) and
    taken by every rank; oneDNN routes the model's linear layers. Not under autocast, FSDP
    (sharded weights) or compile."""
    eligible = t.precision.dtype is None and _may_route(t.tp)
    answer = None
    if t.dist.main:
        # the MLflow run connects in a background thread (imports, the store); a probe in a run's
        # setup on 2 idle cores read oneDNN 48 ms against MKL's 35, where alone the same layers
        # take 17-21 against 31-33: a probe waits for that thread (`active` joins it; build
        # waits for it at its end anyway)
        answer = pick_backend(model, t.device, machine_cache(), eligible,
                              before_probe=lambda: t.run.active)
    backend, why = t.dist.broadcast(answer)
    if backend == "onednn":
        route_linear_layers(model)
    return backend, why


def _sampler(t: Trainer) -> WeightedDistributedSampler:
    """Each epoch: windows shifted by an offset, drawn by systematic resampling, shuffled,
    sharded; with an alpha schedule the weights are recomputed from the scores per epoch."""
    params, inputs = t.params, t.inputs
    n_epochs = epochs_to_train(params.train, t.dist.world_size, len(inputs.train_samples))
    weights = (inputs.weights if inputs.scores is None
               else sampling_weights(params, inputs.scores, n_epochs))
    return WeightedDistributedSampler(
        weights, num_replicas=t.dist.world_size, rank=t.dist.rank, seed=params.seed,
        block_size=params.model.block_size, shift_windows=params.weights.shift_windows)

