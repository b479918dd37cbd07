"""One training run of our loop or of transformers' Trainer, in tokens/s, on the same model, data,
micro-batch and precision: what bench/train_throughput.py, train_base_size.py and train_cpu_time.py
time. Not a script (bench/harness.py says how the scripts import it).

A run's inputs come from the stages' own code: `tokenize_with_base` encodes prepared text with
base/model's tokenizer as the tokenize stage does, `make_inputs` makes the rare_terms and weights
outputs. `run_side` then times one side: "ours" (rarelm.train.loop.train, tokens/s from its logged
windows after `warmup` steps), "trainer" (the Trainer as its users run it: transformers' "sdpa"
attention, its default fused AdamW), "ours_full_logits" (our loop on the full [B, T, V] logits)
or "ours_mkl" (our loop with its fp32 products by MKL, torch's own route).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import os
from pathlib import Path

import harness
import numpy as np

BASE = Path(__file__).resolve().parents[1] / "base" / "model"
SHAPES = {  # model params and micro-batch per shape
    "base": {"model": {"name_or_path": str(BASE), "block_size": 128}, "batch_size": 16},
    "gpt2-small": {"model": {"name_or_path": "", "n_layer": 12, "n_head": 12, "n_embd": 768,
                             "block_size": 128}, "batch_size": 1},
}


def shape_params(plain, shape: dict, steps: int, warmup: int):
    """`plain` (one-process params, train.nproc 1) at `shape`'s sizes."""
    model = dataclasses.replace(plain.model, **shape["model"])
    train = dataclasses.replace(plain.train, batch_size=shape["batch_size"], max_steps=steps,
                                log_every=warmup, warmup_steps=min(plain.train.warmup_steps, steps))
    return dataclasses.replace(plain, model=model, train=train)


def tokenize_with_base(prepared: Path, out: Path) -> Path:
    """The prepared splits encoded with base/model's tokenizer, as the tokenize stage does."""
    from rarelm.files import write_json
    from rarelm.params import TokenizerParams
    from rarelm.tokenize import tokenization

    out.mkdir(parents=True, exist_ok=True)
    meta = tokenization.tokenize(TokenizerParams(name_or_path=str(BASE)), prepared, out)
    write_json(out / "meta.json", meta)
    return out


def make_inputs(tokenized: Path, prepared: Path, out: Path, params, name: str) -> tuple[Path, Path]:
    """data/rare and data/weights for `params`, made by the rare_terms and weights stages' code."""
    from rarelm.rare_terms import stage
    from rarelm.weights.stage import compute

    rare_dir, weights_dir = out / "rare", out / f"weights-{name}"
    if not (rare_dir / "terms.jsonl").exists():
        rare_dir.mkdir(parents=True, exist_ok=True)
        stage.rare_terms(params.rare, "", prepared, tokenized, rare_dir)
    weights_dir.mkdir(parents=True, exist_ok=True)
    w, scores, _, _ = compute(params, tokenized, rare_dir)
    np.save(weights_dir / "weights.npy", w)
    np.save(weights_dir / "scores.npy", scores)
    return rare_dir, weights_dir


def run_ours(params, tokenized: Path, rare_dir: Path, weights_dir: Path, work: Path,
             warmup: int) -> float:
    """Tokens/s of our loop (rarelm.train.loop.train) on `params`: the mean of its logged windows
    after step `warmup`."""
    from rarelm.train.inputs import Paths
    from rarelm.train.loop import train

    paths = Paths(tokenized=tokenized, rare=rare_dir, weights=weights_dir,
                  model=work / "model", metrics=work / "train.json", plots=work / "train.csv",
                  metrics_dir=work / "none", cache=work / "cache")
    train(params, paths, progress=False)
    rows = [r for r in csv.DictReader(paths.plots.open()) if r["tokens_per_s"]]
    measured = [float(r["tokens_per_s"]) for r in rows if int(r["step"]) > warmup]
    return float(np.mean(measured))


def run_trainer(params, tokenized: Path, work: Path, warmup: int, attention: str = "sdpa") -> float:
    """Tokens/s of transformers' Trainer on the same model and windows; `attention` "sdpa" is what
    a Trainer user's model runs (transformers' default), "ours" rarelm.train.model.ATTENTION."""
    import torch
    from transformers import Trainer, TrainingArguments

    from rarelm.artifacts.tokenized import Samples, TokenizedData
    from rarelm.train.model import build_model
    from rarelm.train.precision import pick_precision
    from rarelm.train.state import seed_everything

    data = TokenizedData.open(tokenized)
    samples = Samples(data.tokens("train"), params.model.block_size)

    class Windows(torch.utils.data.Dataset):
        def __len__(self):
            return len(samples)

        def __getitem__(self, i):
            ids = torch.from_numpy(samples[i][:-1].astype(np.int64))  # block_size tokens, like ours
            return {"input_ids": ids, "labels": ids}

    tp = params.train
    amp_dtype, _ = pick_precision(tp.precision, torch.device("cpu"))
    # The Trainer's own default (full_determinism=False); our loop turned it on in this process.
    torch.use_deterministic_algorithms(False)
    seed_everything(params.seed)
    model = build_model(params.model, data)
    if attention == "sdpa":
        model.set_attn_implementation("sdpa")
    clock = harness.trainer_clock(warmup)
    args = TrainingArguments(
        output_dir=str(work / "trainer"), use_cpu=True, max_steps=tp.max_steps,
        per_device_train_batch_size=tp.batch_size, gradient_accumulation_steps=tp.grad_accum,
        learning_rate=tp.lr, weight_decay=tp.weight_decay, adam_beta1=0.9, adam_beta2=0.95,
        warmup_steps=tp.warmup_steps, lr_scheduler_type="cosine", max_grad_norm=tp.grad_clip,
        bf16=amp_dtype == torch.bfloat16, seed=params.seed,  # its default optimizer: fused AdamW
        dataloader_num_workers=0, report_to=[], save_strategy="no", eval_strategy="no",
        logging_strategy="no", disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=Windows(), callbacks=[clock]).train()
    return clock.tokens_per_s(tp.batch_size * tp.grad_accum * params.model.block_size)


@contextlib.contextmanager
def full_logits():
    """Our loop as before the chunked loss: the full [B, T, V] logits and F.cross_entropy
    (rarelm.train.output's fallback path), for an arm that shows what the chunked loss gains."""
    from rarelm.train import setup
    from rarelm.train.output import OutputLayer

    chunked = setup.output_layer
    setup.output_layer = lambda model, chunked, mm=None: OutputLayer()
    try:
        yield
    finally:
        setup.output_layer = chunked


@contextlib.contextmanager
def matmul_backend(name: str | None):
    """Our loop with its fp32 products by `name` (RARELM_MATMUL: "mkl", torch's own route), for an
    arm that shows what oneDNN gains (rarelm/train/matmul.py); None: as measured."""
    from rarelm.train.matmul import MATMUL_ENV

    before = os.environ.get(MATMUL_ENV)
    if name is not None:
        os.environ[MATMUL_ENV] = name
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(MATMUL_ENV, None)
        else:
            os.environ[MATMUL_ENV] = before


SIDES = ("ours", "trainer", "ours_full_logits", "ours_mkl")


def run_side(side: str, params, tokenized: Path, rare_dir: Path, weights_dir: Path, work: Path,
             warmup: int, trainer_attention: str = "sdpa") -> float:
    """Tokens/s of one of SIDES on `params` (the module's docstring says what each side runs)."""
    if side == "trainer":
        return run_trainer(params, tokenized, work, warmup, trainer_attention)
    with full_logits() if side == "ours_full_logits" else contextlib.nullcontext(), \
            matmul_backend("mkl" if side == "ours_mkl" else None):
        return run_ours(params, tokenized, rare_dir, weights_dir, work, warmup)


def matmul_answer(params, tokenized: Path) -> list[str]:
    """What our loop's fp32 products ran by on this machine, and why (rarelm/train/matmul.py's
    cached answer for this model's layers); under autocast (bf16) nothing is routed."""
    import torch

    from rarelm.artifacts.tokenized import TokenizedData
    from rarelm.train.matmul import pick_backend
    from rarelm.train.model import build_model

    model = build_model(params.model, TokenizedData.open(tokenized))
    return list(pick_backend(model, torch.device("cpu")))


def cpu_description() -> tuple[str, list[str]]:
    """The CPU's model name and which of its flags matter for bf16 (from /proc/cpuinfo)."""
    model, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
    return model, [f for f in wanted if f in flags]
