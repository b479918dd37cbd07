"""Where a training step's time goes, and our loop against transformers' Trainer on the same model and
batch, in one process (issue 54): for a GPU first, with a CPU fallback that keeps the script tested.

    python bench/train_step_profile.py --params P.yaml --tokenized T --rare R --weights W --out DIR

1. ours: the train stage's own setup and step (rarelm.train.setup.build, rarelm.train.step.train_step:
   the model, objective, output layer, fused AdamW, precision of the params file), `--steps` steps;
   tokens/s over the steps after the first `--warmup`, the device synchronised at both ends.
2. syncs: one more step, recording where the host waits for a tensor's value (none expected: losses
   and sums stay on the device until a log row), each with the line that asked. On a GPU by
   torch.cuda.set_sync_debug_mode("warn"); on a CPU by the ops that hand a value to Python
   (`.item()`, `bool()`, `nonzero()`: each one a sync on a GPU), so the CPU run checks the same step;
   a CPU cannot see `.tolist()` or `.cpu()`, no-ops there.
3. profile: torch.profiler over `--active` steps after 1 skipped and 2 warm-up (a schedule, so the table
   stays small): the top kernels and ops by device time (by CPU time on a CPU) -> DIR/profile.txt,
   and a Chrome trace -> DIR/trace.json (open in chrome://tracing or ui.perfetto.dev).
4. Trainer: transformers.Trainer on a fresh model of the same config, the same windows, batch,
   precision (bf16=True / fp16=True as users set it) and fused AdamW; tokens/s over its steps after
   `--warmup` (a callback's clock, the device synchronised).

The last line is one JSON object: {"ours_tokens_per_s", "trainer_tokens_per_s", "ours_over_trainer",
"syncs_per_step", "sync_sites", "top_kernels", "device", ...}.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import harness
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rarelm.params import load_params
from rarelm.train import setup
from rarelm.train.inputs import Paths
from rarelm.train.meter import Meter
from rarelm.train.optim import lr_at, set_lr
from rarelm.train.step import train_step


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def ours(params, paths: Paths, steps: int, warmup: int, active: int, out: Path) -> dict:
    """Our step: tokens/s, host syncs in one step, the profile of `active` steps."""
    t = setup.start(params, paths)
    setup.build(t)
    meter = Meter(t.device, steps + active + 8)

    def step(i: int) -> None:
        set_lr(t.optimizer, lr_at(i, t.tp))
        train_step(t, meter, i)

    for i in range(warmup):
        step(i)
    _sync(t.device)
    t0 = time.perf_counter()
    for i in range(warmup, steps):
        step(i)
    _sync(t.device)
    tokens_per_s = (steps - warmup) * t.tokens_per_step / (time.perf_counter() - t0)
    sites = _syncs(t.device, lambda: step(steps))
    table, top = _profile(t.device, lambda i: step(steps + 1 + i), active, out)
    t.run.finish("FINISHED")
    return {"ours_tokens_per_s": round(tokens_per_s, 1), "syncs_per_step": len(sites),
            "sync_sites": sites[:8], "top_kernels": top, "profile_table": table,
            "loss_chunked": t.output.chunked, "attention": t.raw_model.config._attn_implementation,
            "parameters": sum(p.numel() for p in t.raw_model.parameters())}


class _HostReads(TorchDispatchMode):
    """Records each op of the block that hands a tensor's value to Python, with the line that asked:
    the first frame outside torch (rarelm's, or a library's such as transformers')."""

    OPS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default,
           torch.ops.aten.equal.default, torch.ops.aten.nonzero.default)

    def __init__(self):
        super().__init__()
        self.sites: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in self.OPS:
            frames = [f for f in traceback.extract_stack()[:-1]
                      if f"{os.sep}torch{os.sep}" not in f.filename and f.filename != __file__]
            where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "torch"
            self.sites.append(f"{func.__name__} @ {where}")
        return func(*args, **(kwargs or {}))


def _syncs(device, step) -> list[str]:
    """The places where one step made the host wait for a tensor's value (see the top)."""
    if device.type != "cuda":
        with _HostReads() as reads:
            step()
        return reads.sites
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
            _sync(device)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return [str(w.message).splitlines()[0][:200] + f" @ {Path(w.filename).name}:{w.lineno}"
            for w in caught if "synchroniz" in str(w.message)]


def _profile(device, step, active: int, out: Path) -> tuple[str, list[str]]:
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, schedule=schedule(wait=1, warmup=2, active=active)) as prof:
        for i in range(3 + active):
            step(i)
            _sync(device)
            prof.step()
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = prof.key_averages()
    table = events.table(sort_by=key, row_limit=30, max_name_column_width=70)
    (out / "profile.txt").write_text(table)
    prof.export_chrome_trace(str(out / "trace.json"))
    ranked = sorted(events, key=lambda e: getattr(e, key, 0), reverse=True)
    return table, [e.key[:70] for e in ranked[:12]]


def trainer(params, paths: Paths, steps: int, warmup: int, device) -> float:
    """transformers.Trainer's tokens/s on the same model config, windows, batch and precision."""
    from transformers import Trainer, TrainingArguments

    from rarelm.artifacts.tokenized import Samples, TokenizedData
    from rarelm.train.model import build_model

    data = TokenizedData.open(paths.tokenized)
    block, tp = params.model.block_size, params.train
    samples = Samples(data.tokens("train"), block)

    class Windows(torch.utils.data.Dataset):
        def __len__(self):
            return len(samples)

        def __getitem__(self, i):
            ids = torch.from_numpy(samples.tokens[i * block:i * block + block].astype("int64"))
            return {"input_ids": ids, "labels": ids}

    torch.use_deterministic_algorithms(False)  # the Trainer's default
    model = build_model(params.model, data)
    clock = harness.trainer_clock(warmup, lambda: _sync(device))
    args = TrainingArguments(
        output_dir=str(paths.cache / "trainer"), use_cpu=device.type == "cpu", max_steps=steps,
        per_device_train_batch_size=tp.batch_size, gradient_accumulation_steps=tp.grad_accum,
        learning_rate=tp.lr, weight_decay=tp.weight_decay, adam_beta1=0.9, adam_beta2=0.95,
        warmup_steps=tp.warmup_steps, lr_scheduler_type="cosine", max_grad_norm=tp.grad_clip,
        bf16=tp.precision == "bf16", fp16=tp.precision == "fp16", seed=params.seed, optim="adamw_torch_fused",
        dataloader_num_workers=2 if device.type == "cuda" else 0, dataloader_pin_memory=device.type == "cuda",
        report_to=[], save_strategy="no", eval_strategy="no", logging_strategy="no", disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=Windows(), callbacks=[clock]).train()
    return clock.tokens_per_s(tp.batch_size * tp.grad_accum * block)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=Path, required=True)
    ap.add_argument("--tokenized", type=Path, required=True)
    ap.add_argument("--rare", type=Path, required=True)
    ap.add_argument("--weights", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--active", type=int, default=5)
    ap.add_argument("--no-trainer", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    params = load_params(args.params)
    work = Path(tempfile.mkdtemp(prefix="train_step_profile."))  # checkpoints, the Trainer's folder
    paths = Paths(tokenized=args.tokenized, rare=args.rare, weights=args.weights, model=work / "model",
                  metrics=work / "train.json", plots=work / "train.csv", metrics_dir=work,
                  cache=work / "cache")
    result = ours(params, paths, args.steps, args.warmup, args.active, args.out)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(result.pop("profile_table"), flush=True)
    if not args.no_trainer:
        result["trainer_tokens_per_s"] = round(trainer(params, paths, args.steps, args.warmup, device), 1)
        result["ours_over_trainer"] = round(result["ours_tokens_per_s"] / result["trainer_tokens_per_s"], 3)
    result.update(device=torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu",
                  torch=torch.__version__, batch=params.train.batch_size, block=params.model.block_size,
                  precision=params.train.precision)
    shutil.rmtree(work, ignore_errors=True)
    harness.print_json(result)


if __name__ == "__main__":
    main()
