"""Training throughput at the base model's size and at GPT-2-small's: our loop vs transformers'
Trainer, model FLOPs utilisation against a matmul peak measured here, and a profile of our step.

    python bench/train_base_size.py [--shapes base gpt2-small] [--repeats 2] [--prepared data/prepared]
    python bench/train_base_size.py --shapes base --precisions fp32 bf16 [--sides ours trainer ...]

The data: the demo's prepared text (`--prepared`, from `dvc repro prepare`) tokenized here by
the tokenize stage's own code with the base model's tokenizer (base/model: 8,192 tokens), then
rare_terms and weights by their stages' code (bench/train_runs.make_inputs). Shapes:

* `base`        the committed base model itself (base/model: GPT-2 style, 6 layers x 128, 4 heads,
                vocab 8,192, 2.25M parameters) fine-tuned as `model.name_or_path` at block 128,
                micro-batch 16: base/params.yaml's sizes; `--steps` steps
* `gpt2-small`  GPT-2 small's body (12 layers x 768, 12 heads) from scratch with the same 8,192-token
                vocabulary (GPT-2's 50,257-token tokenizer is not on this offline machine), block
                128, micro-batch 1, `--gpt2-steps` steps

Both loops run the same model (the Trainer's with transformers' own "sdpa" attention, as a Trainer
user loads it, unless `--trainer-attention ours`: ours is rarelm.train.model.ATTENTION, which runs
the attention kernel in fp32 under bf16 autocast; in fp32 the two are the same kernel), windows of
the same data, micro-batch, precision
(`--precision`, else `train.precision` of params.yaml as `auto` resolves it here without a
probe: rarelm.train.precision.resolve)
and fused AdamW (ours: rarelm.train.optim; the Trainer's default `adamw_torch_fused`), one
process with every thread (train.nproc = 1), eager: torch.compile is left off for both, since on
this 2-core CPU it gave no gain for a small GPT-2 and costs minutes of compilation (NOTES.md).
Runs are interleaved (ours, Trainer, per precision, per shape, per repeat; `--precisions fp32
bf16` times both precisions in one run, `--precisions fp32` alone on a CPU with native bf16 is
the AVX2-only case), each run's 1-minute load average printed beside it; each figure is the best
of its repeats, and each repeat's ours / Trainer pair (run one after the other) is in
"per_repeat", tokens/s counted after `--warmup` steps (bench/train_runs.run_side). Ours computes the
loss chunked over tokens from the hidden states (rarelm/train/output.py) and in fp32 runs its
products by oneDNN where rarelm/train/matmul.py measured that faster on this CPU; `--sides ...
ours_full_logits` adds our loop on the full logits, `ours_mkl` our loop with its fp32 products by
MKL (torch's own route).

MFU = (6 N + 12 L d T) x tokens/s / peak, with N the parameters that take part in matmuls
(all but the position embeddings; the tied output layer once), L layers, d width, T block
size (attention scores and their weighted sum, forward and backward, PaLM's count), and peak
the best of `--peak-reps` square matmuls (1,024 x 1,024, in the training precision; in fp32 by
MKL and by oneDNN) measured in this process before and after the runs (the larger is kept).

Then one optimizer step of ours (rarelm.train.step.train_step on the real Trainer set up by
rarelm.train.setup) on the base shape under torch.profiler, after two warm-up steps: the ops
with the most self CPU time. The last line is one JSON object: per shape and precision
("base/fp32", ...) {"ours_tokens_per_s", "trainer_tokens_per_s", "speedup_vs_trainer",
"per_repeat", "flops_per_token", "ours_mfu", "trainer_mfu", "runs"}, and "peak_flops",
"precisions", "load_average_1min", "cpu", "cpu_flags", "threads", "profile".
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from pathlib import Path

import harness
from train_runs import (
    SHAPES,
    SIDES,
    cpu_description,
    make_inputs,
    matmul_answer,
    run_side,
    shape_params,
    tokenize_with_base,
)


def matmul_peak(dtype, reps: int, n: int = 1024) -> float:
    """FLOP/s of the best of `reps` n x n matmuls (2 n^3 FLOPs each) in `dtype` (None: fp32),
    on this process's threads; in fp32 the better of torch's own route (MKL) and oneDNN, which
    our loop takes where it is faster (rarelm/train/matmul.py: on an AMD CPU MKL runs AVX2 only)."""
    import torch

    from rarelm.train.matmul import mm, onednn_available

    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    backends = ["mkl"] + (["onednn"] if dtype is None and onednn_available() else [])
    best = float("inf")
    for backend in backends:
        for rep in range(reps + 2):  # two warm-ups
            t0 = time.perf_counter()
            mm(a, b, backend)
            if rep >= 2:
                best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def flops_per_token(model, block_size: int) -> int:
    """6 N + 12 L d T for a GPT-2-style model (N without the position embeddings).

    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> m = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=8, vocab_size=16, n_positions=4))
    >>> n = sum(p.numel() for p in m.parameters()) - 4 * 8
    >>> flops_per_token(m, 4) == 6 * n + 12 * 2 * 8 * 4
    True
    """
    c = model.config
    n = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()
    return 6 * n + 12 * c.n_layer * c.n_embd * block_size


def shape_summary(params, runs: dict[str, list[float]], tokenized: Path, peak: float) -> dict:
    """One shape's figures: the best run of each side, their ratio and MFU against `peak`."""
    from rarelm.artifacts.tokenized import TokenizedData
    from rarelm.train.model import build_model

    model = build_model(params.model, TokenizedData.open(tokenized))
    flops = flops_per_token(model, params.model.block_size)
    ours, trainer = max(runs["ours"]), max(runs["trainer"])
    figures = {"ours_tokens_per_s": round(ours, 1), "trainer_tokens_per_s": round(trainer, 1),
               "speedup_vs_trainer": round(ours / trainer, 3),
               "per_repeat": [round(a / b, 3) for a, b in zip(runs["ours"], runs["trainer"],
                                                              strict=True)],
               "flops_per_token": flops, "ours_mfu": round(flops * ours / peak, 4),
               "trainer_mfu": round(flops * trainer / peak, 4),
               "batch_size": params.train.batch_size, "block_size": params.model.block_size,
               "steps": params.train.max_steps, "runs": runs}
    if runs.get("ours_full_logits"):
        figures["chunked_over_full_logits"] = round(ours / max(runs["ours_full_logits"]), 3)
    if runs.get("ours_mkl"):
        figures["onednn_over_mkl"] = round(ours / max(runs["ours_mkl"]), 3)
    if params.train.precision == "fp32":  # under autocast nothing is routed
        figures["matmul"] = matmul_answer(params, tokenized)
    return figures


def profile_step(params, tokenized: Path, rare: Path, weights: Path, work: Path) -> str:
    """torch.profiler's table (self CPU time) of one optimizer step of our loop, after two."""
    import torch

    from rarelm.train import setup
    from rarelm.train.inputs import Paths
    from rarelm.train.meter import Meter
    from rarelm.train.step import train_step

    paths = Paths(tokenized=tokenized, rare=rare, weights=weights, model=work / "model",
                  metrics=work / "train.json", plots=work / "train.csv",
                  metrics_dir=work / "none", cache=work / "cache")
    t = setup.start(params, paths)
    try:
        setup.build(t)
        meter = Meter(t.device, params.train.max_steps)
        for step in range(2):
            train_step(t, meter, step)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            train_step(t, meter, 2)
            wall = time.perf_counter() - t0
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18)
        return f"one step: {wall:.3f} s wall under the profiler\n{table}"
    finally:
        t.run.finish("FINISHED")
        t.dist.close()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--prepared", type=Path, default=Path("data/prepared"))
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per base-shape run")
    parser.add_argument("--gpt2-steps", type=int, default=4, help="... per gpt2-small run")
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of tokens/s")
    parser.add_argument("--work", type=Path, help="keep the data made here (and reuse it) in this folder")
    parser.add_argument("--peak-reps", type=int, default=10)
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--trainer-attention", choices=["sdpa", "ours"], default="sdpa",
                        help="the Trainer's model's attention: transformers' default sdpa, as a "
                        "Trainer user runs it, or ours (rarelm.train.model.ATTENTION)")
    parser.add_argument("--precisions", nargs="+", choices=["fp32", "bf16"],
                        help="both loops' precisions, each timed in every repeat (default: "
                        "train.precision, auto by hardware)")
    parser.add_argument("--sides", nargs="+", choices=SIDES,
                        default=["ours", "trainer"], help="the loops to time, in this order")
    return parser.parse_args()


def main() -> None:
    args = parse_args()

    import torch

    from rarelm.params import load_params
    from rarelm.train.precision import resolve

    base = load_params(args.params)
    plain = dataclasses.replace(
        base, alpha=0.0, loss=dataclasses.replace(base.loss, rare_weight=0.0),
        train=dataclasses.replace(base.train, nproc=1, checkpoint_every=10**9, eval_every=10**9,
                                  eval_batches=1),
        tracking=dataclasses.replace(base.tracking, system_metrics=False))
    cpu = torch.device("cpu")
    precisions = [resolve(p, cpu) for p in args.precisions or [base.train.precision]]  # auto: by hardware
    peaks = {p.name: matmul_peak(p.dtype, args.peak_reps) for p in precisions}
    for name, peak in peaks.items():
        print(f"matmul peak ({name}): {peak / 1e9:,.1f} GFLOP/s", flush=True)
    keys = [f"{shape}/{p.name}" for shape in args.shapes for p in precisions]
    results = {key: {side: [] for side in args.sides} for key in keys}
    loads: list[float] = []
    summary: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = args.work or tmp
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp / 'mlflow.db'}"
        tokenized = data / "tokenized"
        if not (tokenized / "meta.json").exists():
            tokenize_with_base(args.prepared, tokenized)
        rare, weights = make_inputs(tokenized, args.prepared, data, plain, "plain")
        steps = {"base": args.steps, "gpt2-small": args.gpt2_steps}
        configs = {f"{name}/{p.name}": shape_params(
            dataclasses.replace(plain, train=dataclasses.replace(plain.train, precision=p.name)),
            SHAPES[name], steps[name], args.warmup) for name in args.shapes for p in precisions}
        for repeat in range(args.repeats):
            for key, params in configs.items():
                for side in args.sides:
                    work = tmp / f"{key.replace('/', '-')}-{side}-{repeat}"
                    figure = run_side(side, params, tokenized, rare, weights, work, args.warmup,
                                      args.trainer_attention)
                    results[key][side].append(figure)
                    loads.append(os.getloadavg()[0])
                    print(f"{key} {side} #{repeat + 1}: {figure:,.1f} tokens/s (load {loads[-1]:.2f})",
                          flush=True)
        for p in precisions:
            peaks[p.name] = max(peaks[p.name], matmul_peak(p.dtype, args.peak_reps))
            print(f"matmul peak ({p.name}), best of before and after: {peaks[p.name] / 1e9:,.1f} "
                  "GFLOP/s", flush=True)
        for key, params in configs.items():
            summary[key] = shape_summary(params, results[key], tokenized,
                                         peaks[params.train.precision])
        first_base = next((key for key in configs if key.startswith("base/")), None)
        if not args.no_profile and first_base:
            profile = profile_step(dataclasses.replace(configs[first_base], train=dataclasses.replace(
                configs[first_base].train, max_steps=10)), tokenized, rare, weights, tmp / "profile")
            print(profile, flush=True)
            summary["profile"] = profile
    model_name, flags = cpu_description()
    summary.update(peak_flops={k: round(v) for k, v in peaks.items()},
                   precisions=[p.name for p in precisions], load_average_1min=loads, cpu=model_name,
                   cpu_flags=flags, threads=torch.get_num_threads(), warmup=args.warmup,
                   trainer_attention=args.trainer_attention,
                   repeats=args.repeats, torch=torch.__version__)
    harness.print_json(summary)


if __name__ == "__main__":
    main()
