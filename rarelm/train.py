"""The training loop: one process per device under torchrun, read top to bottom.

In the spirit of nanoGPT's train.py, everything a training run does is visible
in `train()` below: process group and device, model (optionally with LoRA
adapters, rarelm.lora), DDP or FSDP2 (`train.strategy`, rarelm.sharding), AdamW
with warmup and cosine decay, mixed precision (bf16 autocast, or fp16 with a
GradScaler), gradient accumulation that reduces gradients over the ranks only on
the last micro-step, clipping, logging, periodic validation, and sharded
checkpoints (rarelm.checkpoint) that let a killed run resume bit-identically.

    torchrun --standalone --nproc-per-node 2 -m stages.train     # what dvc.yaml runs
    python -m stages.train                                        # the same (it launches torchrun)

Data: training samples are windows of `model.block_size + 1` tokens of the train
split. Each epoch the `WeightedDistributedSampler` moves the window boundaries by an
offset (0 in epoch 0), draws the windows in proportion to their weights by
systematic resampling (no independent draws: equal weights show every window once
per epoch), shuffles and shards them over the ranks; the stream hands the loop the
windows' start positions (`starts`). The weights are data/weights/weights.npy, or
with `weights.schedule: decay | grow` recomputed each epoch from
data/weights/scores.npy at that epoch's alpha (`rarelm.weights.alpha_at`). The loss is
`rarelm.objectives.objective.Objective`: cross-entropy weighted `1 + loss.rare_weight` on the targets
`loss.targets` selects (the rare bucket of data/rare/buckets.npy, the tokens of term
occurrences in data/rare/term_index.npy, or both), times a per-token weight from the
train counts (TLAT, FACE), optionally focal, logit-adjusted, plus unlikelihood, and
with AGG gating rare output-embedding gradients; the loop calls its `prepare_model`
once, `step_end` after each optimizer step, and checkpoints its per-rank `state`.

Determinism: `torch.use_deterministic_algorithms(True)`, the model initialised
from `seed` on every rank, then per-rank RNG seeds derived from `seed`; every
piece of state that a later step depends on is in the checkpoint.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from rarelm import lora, sharding
from rarelm.errors import RarelmError
from rarelm.params import Params, TrainParams

CURVE_COLUMNS = ("step", "loss", "ce", "rare_ce", "lr", "grad_norm", "tokens_per_s",
                 "val_ce", "val_rare_ce")
UPSTREAM_STAGES = ["prepare", "tokenize", "rare_terms", "weights"]


@dataclasses.dataclass(frozen=True)
class Paths:
    """Where the stage reads and writes (the defaults are the DAG's layout)."""

    tokenized: Path = Path("data/tokenized")
    rare: Path = Path("data/rare")
    weights: Path = Path("data/weights")
    model: Path = Path("models/model")
    metrics: Path = Path("metrics/train.json")
    plots: Path = Path("plots/train.csv")
    metrics_dir: Path = Path("metrics")  # upstream stages' metrics, logged to MLflow
    cache: Path = Path(".cache/train")  # checkpoints, outside DVC's outputs


# --------------------------------------------------------------------------- pieces

def lr_at(step: int, p: TrainParams) -> float:
    """Linear warmup to p.lr over warmup_steps, then cosine decay to p.min_lr at max_steps.

    >>> p = TrainParams(lr=1.0, min_lr=0.0, warmup_steps=10, max_steps=110)
    >>> [round(lr_at(s, p), 3) for s in (0, 9, 10, 60, 110)]
    [0.1, 1.0, 1.0, 0.5, 0.0]
    """
    if step < p.warmup_steps:
        return p.lr * (step + 1) / p.warmup_steps
    if step >= p.max_steps:
        return p.min_lr
    progress = (step - p.warmup_steps) / max(1, p.max_steps - p.warmup_steps)
    return p.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (p.lr - p.min_lr)


CPU_BF16_ENV = "RARELM_CPU_BF16"


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX).

    `RARELM_CPU_BF16=1` / `=0` overrides the answer, so that `train.precision: auto` (and the
    test suite) can run as on the other kind of CPU: `=0` as on an AVX2-only CPU (auto = fp32),
    `=1` as on one with AVX512-BF16/AMX (auto = bf16; where bf16 is not native, torch emulates
    it, correctly but ~10x slower).
    """
    forced = os.environ.get(CPU_BF16_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    if forced:
        raise RarelmError(f"{CPU_BF16_ENV} = {forced!r} is not allowed "
                          "(must be 0, 1, or unset to ask the CPU)")
    return cpu_has_native_bf16()


def cpu_has_native_bf16() -> bool:
    """What the CPU itself says (AVX512-BF16 or AMX tiles), whatever RARELM_CPU_BF16 is."""
    import torch

    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def pick_precision(precision: str, device) -> tuple[Any, bool]:
    """(autocast dtype or None for fp32, whether to use a GradScaler) for the device.

    auto: bf16 where the hardware has it (recent GPUs, CPUs with AVX512-BF16/AMX),
    fp16 with a GradScaler on older GPUs, fp32 on other CPUs. On CPU, `auto` therefore
    depends on the machine: the same params train in bf16 on one CPU and in fp32 on
    another, and their results differ by bf16 rounding. Pin `train.precision` for the same
    arithmetic on every CPU (then only the kernels' float rounding differs between CPU kinds;
    on one machine every precision is bit-for-bit deterministic and resumes bit-identically).
    `RARELM_CPU_BF16=0|1` makes `auto` resolve as on a CPU without / with native bf16.

    >>> import torch
    >>> pick_precision("fp32", torch.device("cpu")), pick_precision("bf16", torch.device("cpu"))
    ((None, False), (torch.bfloat16, False))
    """
    import torch

    if precision == "auto":
        if device.type == "cuda":
            precision = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        else:  # CPUs without native bf16 emulate it ~10x slower than fp32 (measured, AVX2)
            precision = "bf16" if cpu_has_bf16() else "fp32"
    if precision == "fp16" and device.type != "cuda":
        raise RarelmError("params: train.precision = 'fp16' is not allowed on CPU "
                          "(must be auto, bf16 or fp32; fp16 with a GradScaler needs CUDA)")
    return {"bf16": (torch.bfloat16, False), "fp16": (torch.float16, True),
            "fp32": (None, False)}[precision]


class SampleStream:
    """This rank's endless stream of window start positions: epoch after epoch of its sampler.

    Its whole state is (epoch, position), so a checkpoint can put it back exactly. A
    `take` may straddle two epochs (and so two window offsets).
    """

    def __init__(self, sampler):
        self.sampler = sampler
        self.epoch, self.position = 0, 0
        self._starts = None

    def take(self, n: int) -> np.ndarray:
        """The next `n` start positions in the train token array, int64 [n]."""
        out = []
        while n > 0:
            if self._starts is None:
                self._starts = self.sampler.starts(self.epoch)
            chunk = self._starts[self.position:self.position + n]
            out.append(chunk)
            n -= len(chunk)
            self.position += len(chunk)
            if self.position >= len(self._starts):
                self.epoch, self.position, self._starts = self.epoch + 1, 0, None
        return np.concatenate(out)

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def restore(self, state: dict[str, int]) -> None:
        self.epoch, self.position, self._starts = int(state["epoch"]), int(state["position"]), None


def to_batch(tokens_or_samples, starts: np.ndarray, block_size: int, device) -> tuple[Any, Any]:
    """Inputs and next-token targets [len(starts), block_size] on `device`.

    Row i is tokens[starts[i]:starts[i] + block_size + 1] of a token array (or of a
    `Samples`' tokens), split into inputs (all but the last) and targets (all but the first).

    >>> x, y = to_batch(np.arange(10), np.array([3, 0]), 4, __import__("torch").device("cpu"))
    >>> x.tolist(), y.tolist()
    ([[3, 4, 5, 6], [0, 1, 2, 3]], [[4, 5, 6, 7], [1, 2, 3, 4]])
    """
    import torch

    tokens = getattr(tokens_or_samples, "tokens", tokens_or_samples)
    starts = np.asarray(starts, dtype=np.int64)
    if len(starts) and (starts.min() < 0 or starts.max() + block_size + 1 > len(tokens)):
        raise IndexError(f"a window runs outside the {len(tokens)} tokens: starts "
                         f"{starts.min()}..{starts.max()}, block_size {block_size}")
    rows = starts[:, None] + np.arange(block_size + 1)
    windows = torch.from_numpy(np.asarray(tokens[rows]).astype(np.int64))
    if device.type == "cuda":  # pinned host memory lets the copy overlap with compute
        windows = windows.pin_memory().to(device, non_blocking=True)
    return windows[:, :-1], windows[:, 1:]


def rng_state() -> dict[str, Any]:
    """This process's RNG states (torch, CUDA, numpy, python) as weights_only-loadable values."""
    import torch

    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss)}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import torch

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def configure_optimizer(model, p: TrainParams, device):
    """AdamW, fused (one kernel per tensor, CPU and CUDA); weight decay on matrices only.

    The fused kernel is elementwise, so as deterministic as the loop it replaces, and on
    CPU it saves ~10% of a step of the demo model against torch's default per-tensor loop.
    """
    import torch

    params = [q for q in model.parameters() if q.requires_grad]
    groups = [{"params": [q for q in params if q.dim() >= 2], "weight_decay": p.weight_decay},
              {"params": [q for q in params if q.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=p.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)


def val_windows(n_windows: int, count: int) -> np.ndarray:
    """`count` window indices spread evenly over the val split (the same every time)."""
    if n_windows == 0:
        return np.zeros(0, dtype=np.int64)
    return np.unique(np.linspace(0, n_windows - 1, num=min(count, n_windows)).astype(np.int64))


def evaluate_split(model, samples, windows, batch_size, device, autocast, is_rare, dist):
    """(plain CE, rare-target CE) over `windows`, sharded across ranks and summed.

    `model` is the bare model, not the DDP wrapper (whose forward would wait for a
    matching collective). Under FSDP every forward is collective (it all-gathers the
    parameters), so every rank runs as many batches as rank 0, which has the most
    windows; a rank out of windows scores its first one again and counts nothing.
    """
    import torch

    from rarelm.objectives.rare_weight import rare_weighted_loss

    stats = torch.zeros(4, device=device)
    block = samples.block_size
    mine = windows[dist.rank::dist.world_size] * block  # the val windows' start positions
    most = len(windows[0::dist.world_size])
    model.eval()
    with torch.no_grad():
        for start in range(0, most, batch_size):
            batch, counts = mine[start:start + batch_size], 1.0
            if len(batch) == 0:
                batch, counts = windows[:1] * block, 0.0
            x, y = to_batch(samples, batch, block, device)
            with autocast():
                logits = model(input_ids=x, use_cache=False).logits
            stats += counts * rare_weighted_loss(logits, y, is_rare, 0.0)[1]
    model.train()
    dist.all_reduce(stats)
    ce_sum, n, rare_sum, n_rare = stats.tolist()
    nan = float("nan")
    return (ce_sum / n if n else nan), (rare_sum / n_rare if n_rare else nan)


def resume_ranks(ranks: list[dict[str, Any]], saved_world: int, step: int, seed: int, dist,
                 stream: SampleStream, objective) -> dict[str, Any] | None:
    """Put this rank's sampler position, RNG and objective state back from a checkpoint; returns
    its log window (`log_window_state`), or None.

    At the world size it was written at, exactly (bit-identical resume). At another one
    (FSDP or DDP: DCP has already resharded the model and optimizer), approximately, with a
    warning: the epoch is kept and the position scaled so that as many windows have been
    drawn over all ranks; the ranks' RNGs are seeded afresh from (seed, step, rank); the
    objective's state (FACE counts, AGG memory) is taken from rank `rank % saved ranks`, and
    the steps since the last curve row are not counted in the next one.
    """
    if saved_world == dist.world_size:
        mine = ranks[dist.rank]
        stream.restore(mine["stream"])
        set_rng_state(mine["rng"])
        objective.load_state(mine.get("objective"))
        return mine.get("log_window")
    if dist.main:
        print(f"rarelm train: warning: resuming a checkpoint written by {saved_world} processes "
              f"with {dist.world_size}: the model and optimizer are resharded exactly, but the "
              "sample order and random state are not, so the result is not bit-identical to an "
              "uninterrupted run", file=sys.stderr, flush=True)
    first = ranks[0]["stream"]
    stream.restore({"epoch": first["epoch"],
                    "position": first["position"] * saved_world // dist.world_size})
    seed_everything(seed * 1000 + dist.rank + 7919 * step)
    objective.load_state(ranks[dist.rank % saved_world].get("objective"))
    return None


def log_window_state(sums, steps: int, t0: float) -> dict[str, Any]:
    """This rank's curve sums since the last logged row (ce, tokens, rare ce, rare tokens, loss,
    micro-steps), for a checkpoint taken between two rows: the resumed run's next row then
    averages the same steps as an uninterrupted run's (a checkpoint every 5 steps, a row every
    4: the row of step 12 holds steps 9-12 however the run was interrupted at step 10)."""
    return {"sums": sums.detach().cpu(), "steps": steps, "seconds": time.perf_counter() - t0}


class EveryRankError(RarelmError):
    """A RarelmError that every rank raises at the same point: rank 0 says it (after ending its
    MLflow run), the others wait for torchrun to stop them (stages/train.py), so the one line
    is said before the job ends."""


def stop_if_diverged(first_bad, max_steps: int, dist) -> None:
    """Raise an EveryRankError, on every rank alike, if any rank saw a non-finite loss or gradient
    norm: `first_bad` is this rank's first such step, or max_steps + 1 for none."""
    found = first_bad.detach().clone()
    dist.all_reduce(found, op="min")
    if int(found) <= max_steps:
        raise EveryRankError(
            f"step {int(found)}: the loss or gradient norm is not finite (training diverged); "
            "no model written: lower train.lr, set train.grad_clip, or check the pretrained model")


def die_with_parent() -> None:
    """Have the kernel SIGKILL this worker when its torchrun agent dies (Linux).

    torchrun starts workers in sessions of their own, so killing the job's process
    group (SIGKILL, OOM killer) would leave them training on as orphans, racing a
    restarted run for the checkpoints and outputs.
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: no such safety net
        return
    if os.getppid() == 1:  # the agent died before prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)


@dataclasses.dataclass
class Dist:
    """This process's place in the job (torchrun's environment; one process without it)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: Any = None

    @property
    def main(self) -> bool:
        return self.rank == 0

    @classmethod
    def setup(cls) -> Dist:
        import torch
        import torch.distributed as td

        if "LOCAL_RANK" in os.environ:
            die_with_parent()
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            torch.cuda.set_device(local)
            device = torch.device("cuda", local)
        else:
            device = torch.device("cpu")
        # Under torchrun always a process group (and DDP or FSDP), even for one process: the same
        # code path (NCCL or gloo) whatever the world size.
        if "LOCAL_RANK" in os.environ:
            td.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                  device_id=device if device.type == "cuda" else None)
        return cls(rank, local, world, device)

    @property
    def ddp(self) -> bool:
        import torch.distributed as td

        return td.is_available() and td.is_initialized()

    def all_reduce(self, tensor, op: str = "sum") -> None:
        if self.ddp:
            import torch.distributed as td

            td.all_reduce(tensor, op={"sum": td.ReduceOp.SUM, "min": td.ReduceOp.MIN}[op])

    def broadcast(self, value: Any) -> Any:
        if not self.ddp:
            return value
        import torch.distributed as td

        box = [value]
        td.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, value: Any) -> list[Any]:
        """Every rank's `value`, on rank 0 (other ranks get [])."""
        if not self.ddp:
            return [value]
        import torch.distributed as td

        out = [None] * self.world_size if self.main else None
        td.gather_object(value, out, dst=0)
        return out or []

    def barrier(self) -> None:
        if self.ddp:
            import torch.distributed as td

            td.barrier()

    def close(self) -> None:
        if self.ddp:
            import torch.distributed as td

            if td.is_initialized():
                td.destroy_process_group()


def input_files(paths: Paths, params: Params) -> list[Path]:
    """Every file the run reads: its checkpoint key hashes their content."""
    tokenizer = sorted(p for p in (paths.tokenized / "tokenizer").glob("*") if p.is_file())
    scores = [paths.weights / "scores.npy"] if params.weights.schedule != "constant" else []
    terms = [paths.rare / "term_index.npy"] if params.loss.targets != "rare_bucket" else []
    counts = [paths.rare / "counts.npy"] if _needs_counts(params) else []
    return [paths.tokenized / "meta.json", paths.tokenized / "train.tokens",
            paths.tokenized / "val.tokens", *tokenizer, paths.rare / "buckets.npy",
            paths.weights / "weights.npy", *scores, *terms, *counts]


def _needs_counts(params: Params) -> bool:
    from rarelm.objectives.objective import needs_counts

    return needs_counts(params.loss)


def load_inputs(params: Params, paths: Paths):
    """(TokenizedData, train Samples, val Samples, weights, log scores, buckets, term index,
    train token counts), all checked.

    The log scores (data/weights/scores.npy) are read only where `weights.schedule`
    varies alpha, which recomputes the weights from them each epoch; the term index
    (data/rare/term_index.npy) only where `loss.targets` weighs term tokens; the counts
    (data/rare/counts.npy) only where a `loss.*` objective reads them; else None.
    """
    from rarelm.data import Samples, TokenizedData
    from rarelm.tracking import check_tensorboard

    check_tensorboard(params.tracking)  # before any worker starts
    data = TokenizedData.open(paths.tokenized)
    block = params.model.block_size
    train_samples = Samples(data.tokens("train"), block)
    val_samples = Samples(data.tokens("val"), block)
    if len(train_samples) == 0:
        raise RarelmError(f"{paths.tokenized}: the train split has fewer than "
                          f"model.block_size + 1 = {block + 1} tokens")
    from rarelm.rare import load_buckets
    from rarelm.weights import load_weights

    buckets = load_buckets(paths.rare, data.vocab_size)
    weights = load_weights(paths.weights / "weights.npy", len(train_samples))
    scores = None
    if params.weights.schedule != "constant":
        from rarelm.files import load_array

        scores = load_array(paths.weights / "scores.npy", np.float64, len(train_samples), "weights",
                            "(one log score per training sample); it does not match the tokenized data")
    term_index = None
    if params.loss.targets != "rare_bucket":
        from rarelm.rare import TermIndex

        term_index = TermIndex.open(paths.rare, data)
    counts = None
    if _needs_counts(params):
        from rarelm.rare import load_counts

        counts = load_counts(paths.rare, data.vocab_size)
    return data, train_samples, val_samples, weights, scores, buckets, term_index, counts


def epochs_to_train(tp: TrainParams, world_size: int, n_windows: int) -> int:
    """Epochs the run starts: max_steps * batch_size * grad_accum samples per rank, rounded up.

    >>> epochs_to_train(TrainParams(max_steps=150, batch_size=16, grad_accum=1), 2, 2880)
    2
    """
    per_rank_epoch = -(-n_windows // world_size)
    return max(1, -(-tp.max_steps * tp.batch_size * tp.grad_accum // per_rank_epoch))


def sampling_weights(params: Params, scores: np.ndarray, n_epochs: int):
    """Epoch -> the windows' weights from their log scores at the epoch's alpha (`alpha_at`)."""
    from rarelm.weights import alpha_at, weights_from_scores

    wp = params.weights

    def at_epoch(epoch: int) -> np.ndarray:
        return weights_from_scores(scores, alpha_at(wp.schedule, params.alpha, epoch, n_epochs),
                                   wp.clip_ratio)

    return at_epoch


def write_curves(path: Path, rows: list[dict[str, Any]]) -> None:
    from rarelm.files import atomic_file

    with atomic_file(path) as f:
        f.write(",".join(CURVE_COLUMNS) + "\n")
        for row in rows:
            f.write(",".join(_fmt(row.get(c)) for c in CURVE_COLUMNS) + "\n")


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value) if isinstance(value, int) else f"{value:.6g}"


def exit_on_sigterm(*_) -> None:
    """A SIGTERM handler: SystemExit(143) once, so `finally` and `except` blocks run (the MLflow
    run ends FAILED); further SIGTERMs (torchrun's shutdown sends more than one) are ignored
    rather than cutting that short. torchrun's SIGKILL after 30 s still ends a hung process."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(128 + signal.SIGTERM)


def save_model(model, data, paths: Paths, run, card: str = "") -> None:
    """models/model: save_pretrained (safetensors, config) + the tokenizer + the run file, made a
    complete Hugging Face folder (rarelm.export: context length, generation defaults, model card)."""
    from transformers.utils import logging as hf_logging

    from rarelm import export
    from rarelm.files import atomic_dir

    hf_logging.disable_progress_bar()  # no "Writing model shards" bar in the stage's log
    with atomic_dir(paths.model) as tmp:
        if lora.is_lora(model):
            lora.save_merged(model, tmp)  # + the adapter in tmp/adapter
        else:
            model.save_pretrained(tmp)
        for path in sorted(data.tokenizer_dir.iterdir()):
            if path.is_file():
                shutil.copy2(path, tmp / path.name)
        export.complete(tmp, card)
        run.save(tmp / "mlflow_run.json")


# --------------------------------------------------------------------------- the loop

def train(params: Params, paths: Paths = Paths(), progress: bool = True) -> dict[str, Any] | None:
    """Train, write models/model, metrics and curves; the metrics on rank 0, None elsewhere."""
    import torch

    from rarelm import checkpoint, export, tracking
    from rarelm.files import write_json
    from rarelm.model import build_model, fingerprint_files, provenance
    from rarelm.objectives.objective import Objective
    from rarelm.objectives.selection import rare_mask
    from rarelm.sampler import WeightedDistributedSampler

    tp, block = params.train, params.model.block_size
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
    dist = Dist.setup()
    device = dist.device
    sharding.check_world_size(tp.strategy, dist.world_size)
    # Bitwise reproducible on CPU; on CUDA some kernels (e.g. flash attention backward)
    # have no deterministic version, so there it warns instead of refusing to run.
    if tp.compile:
        torch.use_deterministic_algorithms(True, warn_only=device.type == "cuda")
    else:  # the public call also imports torch._inductor (~6 s per worker) to configure it
        torch._C._set_deterministic_algorithms(True, warn_only=device.type == "cuda")
    amp_dtype, use_scaler = pick_precision(tp.precision, device)
    # What `auto` became on this machine: recorded with the metrics, since results differ by it.
    precision = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(amp_dtype, "fp32")

    def autocast():
        return torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None)

    data, train_samples, val_samples, weights, scores, buckets, term_index, counts = \
        load_inputs(params, paths)

    # Resume: the newest intact checkpoint of exactly these params + data, if any. Not keyed
    # by the number of processes: a run can go on at another world size (DCP reshards).
    launch = ("nproc", "max_restarts")
    stage_params = {"seed": params.seed, "model": dataclasses.asdict(params.model),
                    "train": {k: v for k, v in dataclasses.asdict(tp).items() if k not in launch},
                    "loss": dataclasses.asdict(params.loss), "alpha": params.alpha,
                    "weights": {"schedule": params.weights.schedule,
                                "clip_ratio": params.weights.clip_ratio,
                                "shift_windows": params.weights.shift_windows}}
    pinned = provenance(params.model, data)  # hub commits: a new revision is a new run
    key = checkpoint.run_key(stage_params | pinned,
                             input_files(paths, params) + fingerprint_files(params.model))
    store = checkpoint.CheckpointStore(paths.cache, key)
    found = dist.broadcast(str(store.latest_valid() or "") if dist.main else None)
    state: dict[str, Any] = {"step": 0, "curves": [], "elapsed": 0.0, "tokens": 0, "run_id": None,
                             "val": {}}
    if found:
        state = store.load_state(Path(found))

    # Tracking on rank 0 only; it connects in the background while the model is built.
    run = tracking.Run("train", "", "")  # inert on other ranks
    if dist.main:
        run = tracking.start_run(params, stage="train", run_id=state["run_id"], background=True,
                                 inputs=[paths.tokenized, paths.rare, paths.weights])
        # torchrun stops the other workers with SIGTERM when one fails: end the run as FAILED.
        signal.signal(signal.SIGTERM, exit_on_sigterm)
    bar = None
    try:
        seed_everything(params.seed)  # the same initial weights on every rank
        model = build_model(params.model, data).to(device)
        raw_model = model  # what we save and checkpoint, whatever wraps it below
        if tp.gradient_checkpointing:
            model.activation_checkpointing_enable(  # transformers 5's name for it
                activation_checkpointing_kwargs={"use_reentrant": False})
        is_rare = rare_mask(buckets, model.get_input_embeddings().num_embeddings).to(device)
        per_rank = -(-len(train_samples) // dist.world_size)
        steps_per_epoch = -(-per_rank // (tp.batch_size * tp.grad_accum))  # AGG's memory
        objective = Objective.from_params(params.loss, buckets, len(is_rare), device, term_index,
                                          counts, steps_per_epoch)
        objective.prepare_model(raw_model)  # AGG: gate the output layer's gradient
        # DDP wraps the model; FSDP2 shards it in place (so raw_model is sharded too), before
        # the optimizer is built on its parameters: AdamW's state then exists per shard only.
        model = sharding.wrap(model, tp.strategy, dist, amp_dtype)
        optimizer = configure_optimizer(model, tp, device)
        scaler = torch.amp.GradScaler(device.type, enabled=use_scaler)
        # Each epoch: windows shifted by an offset, drawn by systematic resampling, shuffled,
        # sharded; with an alpha schedule the weights are recomputed from the scores per epoch.
        n_epochs = epochs_to_train(tp, dist.world_size, len(train_samples))
        sampler = WeightedDistributedSampler(
            weights if scores is None else sampling_weights(params, scores, n_epochs),
            num_replicas=dist.world_size, rank=dist.rank, seed=params.seed, block_size=block,
            shift_windows=params.weights.shift_windows)
        stream = SampleStream(sampler)  # start positions of windows in the train tokens
        val_idx = val_windows(len(val_samples), tp.eval_batches * tp.batch_size)
        saved_window = None
        if found:
            store.load_weights(Path(found), raw_model, optimizer)
            scaler.load_state_dict(state.pop("scaler"))
            saved_window = resume_ranks(state.pop("ranks"), state.pop("world_size"), state["step"],
                                        params.seed, dist, stream, objective)
        else:
            seed_everything(params.seed * 1000 + dist.rank)  # per-rank dropout, reproducibly
        start_step = state["step"]
        # Logged with the first step metrics, so that connecting has had time to finish.
        first_metrics = {} if start_step else tracking.upstream_metrics(paths.metrics_dir, UPSTREAM_STAGES)

        if tp.compile:
            model = torch.compile(model)

        run.require()  # a store that cannot log (tracking.required): one line before any step
        bar = _progress(dist.main and progress, tp.max_steps, start_step)
        if found and dist.main:
            bar.console.print(f"train: resuming from {found} (step {start_step})")

        tokens_per_step = tp.batch_size * params.model.block_size * tp.grad_accum * dist.world_size
        model.train()
        window = torch.zeros(4, device=device)  # ce_sum, tokens, rare_ce_sum, rare_tokens
        window_loss, window_t0, window_steps = torch.zeros(2, device=device), time.perf_counter(), 0
        if saved_window is not None:  # the steps since the last row before the checkpoint
            window += saved_window["sums"][:4].to(device)
            window_loss += saved_window["sums"][4:].to(device)
            window_steps, window_t0 = saved_window["steps"], window_t0 - saved_window["seconds"]
        # The first step with a non-finite loss or gradient norm (none: max_steps + 1), kept on
        # the device and checked only where a row or checkpoint is written (no sync per step).
        first_bad = torch.full((), tp.max_steps + 1, dtype=torch.long, device=device)
        session_t0, grad_norm, state_bytes = time.perf_counter(), torch.zeros(()), 0
        session_step = start_step  # tokens trained = those before this session + this one's
        for step in range(start_step, tp.max_steps):
            lr = lr_at(step, tp)
            for group in optimizer.param_groups:
                group["lr"] = lr

            # Gradient accumulation: DDP all-reduces gradients only on the last micro-step.
            for micro in range(tp.grad_accum):
                starts = stream.take(tp.batch_size)  # where this micro-batch's windows begin
                x, y = to_batch(train_samples, starts, block, device)
                last = micro == tp.grad_accum - 1
                with sharding.gradient_sync(model, last):
                    with autocast():
                        logits = model(input_ids=x, use_cache=False).logits
                    loss, stats = objective(logits, y, starts)
                    scaler.scale(loss / tp.grad_accum).backward()
                window += stats
                window_loss += torch.stack([loss.detach(), torch.ones((), device=device)])

            scaler.unscale_(optimizer)  # true gradient norm, also under fp16 loss scaling
            grad_norm = torch.nn.utils.clip_grad_norm_(
                raw_model.parameters(), tp.grad_clip if tp.grad_clip > 0 else float("inf"))
            if not use_scaler:  # fp16: the GradScaler skips steps with non-finite gradients itself
                finite = torch.isfinite(window_loss[0]) & torch.isfinite(sharding.local(grad_norm))
                first_bad = torch.where(finite, first_bad, first_bad.clamp(max=step + 1))
            scaler.step(optimizer)  # skips the step if fp16 gradients overflowed
            scaler.update()
            if step == start_step:  # gradients and AdamW state exist now: what this rank holds
                state_bytes = max(dist.gather(sharding.state_bytes(raw_model, optimizer)) or [0])
            optimizer.zero_grad(set_to_none=True)
            done = step + 1
            objective.step_end(done, dist)  # FACE: counts summed over ranks; AGG: its window
            window_steps += 1

            row: dict[str, Any] = {}
            if done % tp.log_every == 0 or done % tp.checkpoint_every == 0 or done == tp.max_steps:
                stop_if_diverged(first_bad, tp.max_steps, dist)  # before it is logged or saved
            if done % tp.log_every == 0 or done == tp.max_steps:
                sums = torch.cat([window, window_loss])
                dist.all_reduce(sums)  # averages over every rank's tokens
                ce_sum, n, rare_sum, n_rare, loss_sum, n_loss = sums.tolist()
                elapsed = time.perf_counter() - window_t0
                row = {"step": done, "loss": loss_sum / n_loss, "ce": ce_sum / n,
                       "rare_ce": rare_sum / n_rare if n_rare else float("nan"), "lr": lr,
                       "grad_norm": float(sharding.whole(grad_norm)),
                       "tokens_per_s": window_steps * tokens_per_step / elapsed}
                window.zero_()
                window_loss.zero_()
                window_t0, window_steps = time.perf_counter(), 0
            if done % tp.eval_every == 0 or done == tp.max_steps:
                val_ce, val_rare = evaluate_split(raw_model, val_samples, val_idx, tp.batch_size,
                                                  device, autocast, is_rare, dist)
                row.update(step=done, val_ce=val_ce, val_rare_ce=val_rare)
                state["val"] = {"val_ce": val_ce, "val_rare_ce": val_rare}
                window_t0 = time.perf_counter()  # validation time is not training throughput
            if row and dist.main:
                state["curves"].append(row)
                if first_metrics:  # counts and settings of the earlier stages: an artifact
                    run.log_json(first_metrics, "upstream.json")
                    first_metrics = {}
                run.log_metrics({f"train/{k}": v for k, v in row.items()
                                 if k != "step" and not k.startswith("val")}
                                | {f"val/{k[4:]}": v for k, v in row.items()
                                   if k.startswith("val_")}, step=done)
                _show(bar, row, tp.max_steps)
            bar.update(0, completed=done)

            if done % tp.checkpoint_every == 0 and done < tp.max_steps:
                state.update(step=done, run_id=run.run_id,
                             elapsed=state["elapsed"] + time.perf_counter() - session_t0,
                             tokens=state["tokens"] + (done - session_step) * tokens_per_step)
                session_t0, session_step = time.perf_counter(), done
                ranks = dist.gather({"stream": stream.state(), "rng": rng_state(),
                                     "objective": objective.state(),
                                     "log_window": log_window_state(torch.cat([window, window_loss]),
                                                                    window_steps, window_t0)})
                store.save(done, raw_model, optimizer,
                           {**state, "scaler": scaler.state_dict(), "ranks": ranks}, dist)

        elapsed = state["elapsed"] + time.perf_counter() - session_t0
        tokens = state["tokens"] + (tp.max_steps - session_step) * tokens_per_step
        final_model = raw_model
        if tp.strategy == "fsdp":  # gathered whole on rank 0, into an unsharded model to save
            full = sharding.full_state_dict(raw_model)
            if dist.main:
                final_model = build_model(params.model, data)
                final_model.load_state_dict(full)
                del full
        metrics = None
        if dist.main:
            run.require()  # logging failed on the way: no outputs; a re-run resumes the last checkpoint
            metrics = {**_final_metrics(state, tp, tokens, elapsed, final_model,
                                        len(train_samples) * block),
                       "state_bytes_per_rank": state_bytes, "precision": precision, **pinned}
            card = export.model_card(params, metrics, tracking.dvc_hashes(
                [paths.tokenized, paths.rare, paths.weights]))
            save_model(final_model, data, paths, run, card)
            write_curves(paths.plots, state["curves"])
            write_json(paths.metrics, metrics)
            run.log_metrics(tracking.measured({f"final/{k}": v for k, v in metrics.items()
                                               if isinstance(v, (int, float))})
                            | tracking.summary_metrics(metrics), step=tp.max_steps)
            run.log_json(metrics, "final/train.json")
            run.set_tags({"precision": precision, **pinned})
            run.log_model(paths.model, params.tracking)  # a pyfunc (rarelm/serving.py); registered if asked
            store.clear()  # finished: a later run with these params starts afresh
        dist.barrier()
        run.finish("FINISHED")
        return metrics
    except BaseException:
        run.finish("FAILED")
        raise
    finally:
        if bar is not None:
            bar.stop()
        dist.close()


def _final_metrics(state, tp, tokens, elapsed, model, epoch_tokens):
    """metrics/train.json; `tokens` trained in all (the world size may have changed on a resume),
    `epoch_tokens` in one pass over the train windows."""
    last = next((r for r in reversed(state["curves"]) if "loss" in r), {})
    metrics = {
        "steps": tp.max_steps, "tokens": tokens, "wall_time_s": round(elapsed, 3),
        "tokens_per_s": round(tokens / elapsed, 1) if elapsed > 0 else 0.0,
        "loss": last.get("loss"), "ce": last.get("ce"), "rare_ce": last.get("rare_ce"),
        "val_ce": state["val"].get("val_ce"), "val_rare_ce": state["val"].get("val_rare_ce"),
        "val_ppl": math.exp(state["val"]["val_ce"]) if "val_ce" in state["val"] else None,
        "epochs": round(tokens / epoch_tokens, 3),
        "parameters": sum(q.numel() for q in model.parameters()),
        "trainable_parameters": lora.trainable_parameters(model),
    }
    # NaN (no rare target seen, no val split) is not JSON: None says "not measured".
    return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in metrics.items()}


def _progress(enabled: bool, total: int, completed: int):
    """A rich progress bar (step, loss, tokens/s, ETA) on rank 0's terminal, and log lines."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    # stderr, so stdout holds only the summary line; soft_wrap: a log line stays one line
    console = Console(stderr=True, soft_wrap=True)
    bar = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("loss {task.fields[loss]:.3f}"),
                   TextColumn("{task.fields[tok_s]:,.0f} tok/s"), TimeRemainingColumn(),
                   console=console, transient=True,
                   disable=not (enabled and console.is_terminal))  # log lines only in a log
    bar.add_task("train", total=total, completed=completed, loss=float("nan"), tok_s=0.0)
    bar.start()
    return bar


def _show(bar, row: dict[str, Any], max_steps: int) -> None:
    parts = [f"step {row['step']}/{max_steps}"]
    for key, fmt in (("loss", ".4f"), ("ce", ".4f"), ("rare_ce", ".4f"), ("lr", ".2e"),
                     ("grad_norm", ".3f"), ("tokens_per_s", ",.0f"), ("val_ce", ".4f"),
                     ("val_rare_ce", ".4f")):
        if key in row:
            parts.append(f"{key} {row[key]:{fmt}}")
    if "tokens_per_s" in row:
        bar.update(0, tok_s=row["tokens_per_s"])
    bar.console.print(" | ".join(parts))


def summary(metrics: dict[str, Any], paths: Paths) -> str:
    """The stage's one-line summary."""
    def f(key: str) -> str:
        return "n/a" if metrics.get(key) is None else f"{metrics[key]:.4f}"

    return (f"train: {metrics['steps']} steps, {metrics['tokens']:,} tokens "
            f"({metrics['epochs']:g} epochs), loss {f('loss')}, val ce {f('val_ce')} "
            f"(rare {f('val_rare_ce')}), {metrics['tokens_per_s']:,.0f} tokens/s "
            f"({metrics.get('precision', 'fp32')}), "
            f"{metrics['wall_time_s']:.0f} s -> {paths.model}")
