"""Training throughput on CPU: our loop vs transformers' Trainer, and the cost of the rare features.

    python bench/train_throughput.py [--steps 30] [--repeats 2] [--tokenized data/tokenized]

Three runs on the same model (the `model` params of params.yaml), data
(data/tokenized, run `dvc repro tokenize` first), micro-batch and precision, in
one process (train.nproc = 1, so nothing else competes for the cores):

* `ours_plain`  rarelm.train.train with alpha = 0 and loss.rare_weight = 0
* `ours_rare`   rarelm.train.train with alpha = 0.7 and loss.rare_weight = 2
* `trainer`     transformers.Trainer (needs `accelerate`), uniform sampling, plain CE

Tokens/s is counted over the steps after the first `--warmup` ones (our loop:
its logged windows; Trainer: a callback's clock), so start-up, compilation of
kernels, validation and saving are left out of all three alike. Runs are
interleaved and repeated; each figure is the best of its repeats, which is the
least disturbed by other load on a shared machine. The last line is one JSON
object: {"ours_tokens_per_s", "trainer_tokens_per_s", "speedup_vs_trainer",
"rare_tokens_per_s", "rare_overhead", ...}.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def make_inputs(tokenized: Path, out: Path, params, alpha: float) -> tuple[Path, Path]:
    """data/rare-like buckets and data/weights-like weights for `alpha`, from the real stages' code."""
    from rarelm import rare, weights
    from rarelm.data import TokenizedData

    data = TokenizedData.open(tokenized)
    tokens = data.tokens("train")
    counts = rare.count_tokens(tokens, data.vocab_size, params.rare.chunk_tokens)
    buckets, _ = rare.bucket_tokens(counts, params.rare.frequent_share, params.rare.rare_share)
    rare_dir, weights_dir = out / "rare", out / f"weights-{alpha}"
    rare_dir.mkdir(parents=True, exist_ok=True)
    weights_dir.mkdir(parents=True, exist_ok=True)
    np.save(rare_dir / "buckets.npy", buckets)
    w = weights.sample_weights(tokens, counts, params.model.block_size, alpha,
                               params.weights.clip_ratio, params.rare.chunk_tokens)
    np.save(weights_dir / "weights.npy", w)
    return rare_dir, weights_dir


def run_ours(params, tokenized: Path, rare_dir: Path, weights_dir: Path, work: Path,
             warmup: int) -> float:
    from rarelm.train import Paths, train

    paths = Paths(tokenized=tokenized, rare=rare_dir, weights=weights_dir,
                  model=work / "model", metrics=work / "train.json", plots=work / "train.csv",
                  metrics_dir=work / "none", cache=work / "cache")
    train(params, paths, progress=False)
    rows = [r for r in csv.DictReader(paths.plots.open()) if r["tokens_per_s"]]
    measured = [float(r["tokens_per_s"]) for r in rows if int(r["step"]) > warmup]
    return float(np.mean(measured))


def run_trainer(params, tokenized: Path, work: Path, warmup: int) -> float:
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from rarelm.data import Samples, TokenizedData
    from rarelm.model import build_model
    from rarelm.train import pick_precision, seed_everything

    data = TokenizedData.open(tokenized)
    samples = Samples(data.tokens("train"), params.model.block_size)

    class Windows(torch.utils.data.Dataset):
        def __len__(self):
            return len(samples)

        def __getitem__(self, i):
            ids = torch.from_numpy(samples[i][:-1].astype(np.int64))  # block_size tokens, like ours
            return {"input_ids": ids, "labels": ids}

    class Clock(TrainerCallback):
        def __init__(self):
            self.t0, self.steps = None, 0

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == warmup:
                self.t0 = time.perf_counter()
            elif state.global_step > warmup:
                self.steps += 1

    tp = params.train
    amp_dtype, _ = pick_precision(tp.precision, torch.device("cpu"))
    seed_everything(params.seed)
    model = build_model(params.model, data)
    clock = Clock()
    args = TrainingArguments(
        output_dir=str(work / "trainer"), use_cpu=True, max_steps=tp.max_steps,
        per_device_train_batch_size=tp.batch_size, gradient_accumulation_steps=tp.grad_accum,
        learning_rate=tp.lr, weight_decay=tp.weight_decay, adam_beta1=0.9, adam_beta2=0.95,
        warmup_steps=tp.warmup_steps, lr_scheduler_type="cosine", max_grad_norm=tp.grad_clip,
        bf16=amp_dtype == torch.bfloat16, optim="adamw_torch", seed=params.seed,
        dataloader_num_workers=0, report_to=[], save_strategy="no", eval_strategy="no",
        logging_strategy="no", disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=Windows(), callbacks=[clock]).train()
    elapsed = time.perf_counter() - clock.t0
    return clock.steps * tp.batch_size * tp.grad_accum * params.model.block_size / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--tokenized", type=Path, default=Path("data/tokenized"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    from rarelm.params import load_params

    base = load_params(args.params)
    train_params = dataclasses.replace(
        base.train, nproc=1, max_steps=args.steps, log_every=args.warmup, checkpoint_every=10**9,
        eval_every=10**9, eval_batches=1, warmup_steps=min(base.train.warmup_steps, args.steps))
    plain = dataclasses.replace(base, alpha=0.0, train=train_params,
                                loss=dataclasses.replace(base.loss, rare_weight=0.0),
                                tracking=dataclasses.replace(base.tracking, system_metrics=False))
    rare = dataclasses.replace(plain, alpha=0.7,
                               loss=dataclasses.replace(base.loss, rare_weight=2.0))
    results: dict[str, list[float]] = {"ours_plain": [], "ours_rare": [], "trainer": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp / 'mlflow.db'}"
        rare_dir, weights0 = make_inputs(args.tokenized, tmp, plain, 0.0)
        _, weights7 = make_inputs(args.tokenized, tmp, rare, 0.7)
        for repeat in range(args.repeats):
            for name in results:
                work = tmp / f"{name}-{repeat}"
                if name == "trainer":
                    figure = run_trainer(plain, args.tokenized, work, args.warmup)
                else:
                    params, w = (plain, weights0) if name == "ours_plain" else (rare, weights7)
                    figure = run_ours(params, args.tokenized, rare_dir, w, work, args.warmup)
                results[name].append(figure)
                print(f"{name} #{repeat + 1}: {figure:,.0f} tokens/s", flush=True)
    best = {name: max(values) for name, values in results.items()}
    import torch

    from rarelm.train import pick_precision

    amp_dtype, _ = pick_precision(base.train.precision, torch.device("cpu"))
    summary = {
        "ours_tokens_per_s": round(best["ours_plain"], 1),
        "trainer_tokens_per_s": round(best["trainer"], 1),
        "speedup_vs_trainer": round(best["ours_plain"] / best["trainer"], 3),
        "rare_tokens_per_s": round(best["ours_rare"], 1),
        "rare_overhead": round(1 - best["ours_rare"] / best["ours_plain"], 4),
        "runs": {k: [round(v, 1) for v in vs] for k, vs in results.items()},
        "steps": args.steps, "warmup": args.warmup, "batch_size": base.train.batch_size,
        "block_size": base.model.block_size, "precision": str(amp_dtype or "fp32"),
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
