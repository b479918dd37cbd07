"""Training throughput on CPU: our loop vs transformers' Trainer, and the cost of the rare features.

    python bench/train_throughput.py [--steps 30] [--repeats 2] [--tokenized ...] [--prepared ...]
    python bench/train_throughput.py --precisions fp32 bf16 [--steps 30] [--repeats 3]

Runs on the same model (the `model` params of params.yaml), data (data/tokenized and
data/prepared: run `dvc repro tokenize` first; the rare_terms and weights outputs are
made here by the stages' own code), micro-batch and precision, in one process
(train.nproc = 1, so nothing else competes for the cores):

* `ours_plain`  rarelm.train.loop.train with alpha = 0 and loss.rare_weight = 0
* `ours_rare`   alpha = 0.7 (frequency scores) and loss.rare_weight = 2 on the rare bucket
* `ours_terms`  term-aware sampling and loss: weights.score = terms, alpha = 1,
                loss.targets = terms, loss.rare_weight = 2
* `trainer`     transformers.Trainer (needs `accelerate`), uniform sampling, plain CE

Tokens/s is counted over the steps after the first `--warmup` ones (our loop:
its logged windows; Trainer: a callback's clock), so start-up, compilation of
kernels, validation and saving are left out of all alike. Runs are
interleaved and repeated; each figure is the best of its repeats, which is the
least disturbed by other load on a shared machine.

The rare features' overhead is reported twice: end to end (`ours_rare` and
`ours_terms` against `ours_plain`, best of repeats: noisy on a shared machine) and
as `rare_overhead` / `terms_overhead`, the extra time of the weighted loss
(forward + backward; for terms also the term-index lookup of the batch's target
positions), timed interleaved with the plain one, median of 40, over the time of
one plain step, which is all they add per step: the sampler's epoch draw costs the
same for any weights. `objective_overhead` does the same for each `loss.*` objective
of rarelm/objectives/ (tlat_exp, tlat_chi2, face from targets or predictions, focal,
logit_adjust, unlikelihood (previous-context negatives), frequent_unlikelihood at term
targets, terms_after_first, normalize, agg), the output layer included in every timing
since AGG changes its backward pass. `loss.kl_base` is not in it: its cost is one more
forward of the whole model, no backward (rarelm/objectives/kl_base.py). The last line is one JSON object:
{"ours_tokens_per_s", "trainer_tokens_per_s", "speedup_vs_trainer", "rare_tokens_per_s",
"terms_tokens_per_s", "rare_overhead", "terms_overhead", "objective_overhead", ...}.

With `--precisions fp32 bf16` (or one of them) it times, per precision, our loop
(`ours_plain`, its loss chunked over tokens: rarelm/objectives/linear_ce.py) and the Trainer as
its users run it (its defaults: transformers' "sdpa" attention, fp32 unless `bf16=True` in the
bf16 arm, fused AdamW), and with `--arms ... ours_full_logits` our loop with the full logits
(the path before the chunked loss) and `ours_mkl` our loop with its fp32 products by MKL (torch's own
route: `RARELM_MATMUL=mkl`; `ours` takes oneDNN where rarelm/train/matmul.py measured it faster on
this CPU), interleaved: ours, Trainer, ... per precision, per repeat,
so that other load on a shared machine hits both alike; each run's 1-minute load average is
printed beside it. `--precisions fp32` on a CPU with native bf16 is the AVX2-only case (there
`auto` is fp32). Then one training step of the same model, batch, loss and fused AdamW in each
precision, alternating step by step in one process (median of `--step-reps`). The JSON line
then holds {"tokens_per_s": {precision: {arm: best}}, "ours_over_trainer": {precision: best
over best}, "ours_over_trainer_per_repeat": {precision: [each repeat's pair]},
"chunked_over_full_logits", "bf16_over_fp32", "step_tokens_per_s", "load_average_1min", "cpu",
"cpu_flags", "cpu_has_bf16", ...}; bf16 is native on CPUs with AVX512-BF16/AMX and emulated
(much slower) on others.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import harness
import numpy as np
from train_runs import SIDES, cpu_description, make_inputs, matmul_answer, run_ours, run_side, run_trainer


def loss_cost(params, tokenized: Path, rare_dir: Path, reps: int = 40) -> dict[str, float]:
    """Median seconds of output layer + loss, forward + backward + `step_end`, per objective,
    interleaved in a new random order each repeat.

    The rare features cost nothing else per step (the sampler's epoch draw costs the same
    for any weights), so this difference over a step's time is their overhead, measured
    so that other load on the machine hits all sides alike. The output layer (hidden
    states [B, T, n_embd] times the [V, n_embd] matrix) is in every figure, since AGG
    changes its backward pass; as in the train step, the loss is chunked over tokens from the
    hidden states unless the objective needs the full logits (rarelm/train/output.py). The term
    targets include the term-index lookup of the batch's target positions, at random window starts.
    """
    import types

    import torch

    from rarelm.artifacts.buckets import load_buckets, load_counts
    from rarelm.artifacts.term_index import TermIndex
    from rarelm.artifacts.tokenized import Samples, TokenizedData
    from rarelm.objectives.hidden import HiddenStates
    from rarelm.objectives.objective import Objective
    from rarelm.params import LossParams

    data = TokenizedData.open(tokenized)
    vocab, block, width = data.vocab_size, params.model.block_size, params.model.n_embd
    generator = torch.Generator().manual_seed(0)
    shape = (params.train.batch_size, block)
    hidden = torch.randn(*shape, width, generator=generator, requires_grad=True)
    targets = torch.randint(0, vocab, shape, generator=generator)
    buckets, counts = load_buckets(rare_dir, vocab), load_counts(rare_dir, vocab)
    index = TermIndex.open(rare_dir, data)
    n_windows = len(Samples(data.tokens("train"), block))
    steps_per_epoch = -(-n_windows // params.train.batch_size)
    cpu = torch.device("cpu")

    def objective(targets: str = "rare_bucket", rare_weight: float = 0.0, **loss) -> Objective:
        lp = LossParams(targets=targets, rare_weight=rare_weight, **loss)
        return Objective.from_params(lp, buckets, vocab, cpu, index if targets != "rare_bucket" else None,
                                     counts, steps_per_epoch)

    objectives = {"plain": objective(), "rare_bucket": objective(rare_weight=2.0),
                  "terms": objective("terms", 2.0),
                  "tlat_exp": objective(token_weight="tlat_exp"),
                  "tlat_chi2": objective(token_weight="tlat_chi2"),
                  "face": objective(token_weight="face"),
                  "face_predictions": objective(token_weight="face", face_source="predictions"),
                  "focal": objective(focal_gamma=2.0),
                  "logit_adjust": objective(logit_adjust_tau=1.0),
                  "unlikelihood": objective(unlikelihood=1.0),
                  "frequent_unlikelihood": objective("terms", frequent_unlikelihood=1.0),
                  "terms_after_first": objective("terms_after_first", 2.0),
                  "normalize": objective("terms", 2.0, normalize="targets"),
                  "agg": objective(agg=True)}
    plain_head = torch.nn.Linear(width, vocab, bias=False)
    heads = {}
    for name, obj in objectives.items():
        heads[name] = plain_head
        if obj.agg is not None:  # its own copy of the output layer, routed through the gate
            heads[name] = torch.nn.Linear(width, vocab, bias=False)
            heads[name].weight.data.copy_(plain_head.weight.data)
            obj.prepare_model(types.SimpleNamespace(get_output_embeddings=lambda h=heads[name]: h))
    rng = np.random.default_rng(0)
    times: dict[str, list[float]] = {name: [] for name in objectives}
    for rep in range(reps):
        starts = rng.integers(0, n_windows, shape[0]) * block
        for name in rng.permutation(list(objectives)):  # no objective always first after another
            obj = objectives[name]
            t0 = time.perf_counter()
            # as the train step: the hidden states where the objective allows (rarelm.train.output)
            scores = heads[name](hidden) if obj.needs_logits else HiddenStates(hidden, plain_head.weight)
            loss, _ = obj(scores, targets, starts, targets)  # inputs: any ids
            loss.backward()
            obj.step_end(rep + 1)
            times[name].append(time.perf_counter() - t0)
            hidden.grad = heads[name].weight.grad = None
    return {name: float(np.median(t)) for name, t in times.items()}


def step_cost(params, tokenized: Path, precisions: list[str], reps: int) -> dict[str, float]:
    """Median seconds of one training step (forward under autocast, fp32 loss, backward,
    clipping, fused AdamW) per precision, the precisions alternating step by step."""
    import torch

    from rarelm.artifacts.tokenized import Samples, TokenizedData
    from rarelm.objectives.rare_weight import rare_weighted_loss
    from rarelm.train.batches import to_batch
    from rarelm.train.model import build_model
    from rarelm.train.optim import configure_optimizer
    from rarelm.train.precision import pick_precision
    from rarelm.train.state import seed_everything

    cpu = torch.device("cpu")
    data = TokenizedData.open(tokenized)
    samples = Samples(data.tokens("train"), params.model.block_size)
    batch = np.random.default_rng(0).integers(0, len(samples), params.train.batch_size)
    x, y = to_batch(samples, batch * params.model.block_size, params.model.block_size, cpu)
    is_rare = torch.zeros(data.vocab_size, dtype=torch.bool)
    runs = {}
    for precision in precisions:
        seed_everything(params.seed)
        model = build_model(params.model, data).train()
        runs[precision] = (model, configure_optimizer(model, params.train, cpu),
                           pick_precision(precision, cpu)[0])
    times: dict[str, list[float]] = {p: [] for p in precisions}
    for rep in range(reps + 3):  # the first 3 warm up kernels and allocator
        for precision, (model, optimizer, dtype) in runs.items():
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                logits = model(input_ids=x, use_cache=False).logits
            loss, _ = rare_weighted_loss(logits, y, is_rare, 0.0)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), params.train.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if rep >= 3:
                times[precision].append(time.perf_counter() - t0)
    return {p: float(np.median(t)) for p, t in times.items()}


def compare_precisions(plain, args, precisions: list[str]) -> None:
    """Per precision, our loop and the Trainer (and `--arms`), interleaved (ours, Trainer, ...,
    per precision, per repeat), each run's load average beside it; one JSON line."""
    import torch

    from rarelm.train.precision import cpu_has_bf16

    results = {p: {arm: [] for arm in args.arms} for p in precisions}
    loads: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp / 'mlflow.db'}"
        rare_dir, weights0 = make_inputs(args.tokenized, args.prepared, tmp, plain, "plain")
        for repeat in range(args.repeats):
            for precision in precisions:
                params = dataclasses.replace(plain, train=dataclasses.replace(
                    plain.train, precision=precision))
                for arm in args.arms:
                    work = tmp / f"{precision}-{arm}-{repeat}"
                    figure = run_side(arm, params, args.tokenized, rare_dir, weights0, work, args.warmup)
                    results[precision][arm].append(figure)
                    loads.append(os.getloadavg()[0])
                    print(f"{arm} {precision} #{repeat + 1}: {figure:,.0f} tokens/s "
                          f"(load {loads[-1]:.2f})", flush=True)
    best = {p: {arm: max(v) for arm, v in r.items()} for p, r in results.items()}
    tokens = plain.train.batch_size * plain.model.block_size
    steps = {p: tokens / s for p, s in step_cost(plain, args.tokenized, precisions,
                                                   args.step_reps).items()} if args.step_reps else {}
    for p, v in steps.items():
        print(f"one step {p}, median of {args.step_reps}: {v:,.0f} tokens/s", flush=True)
    both = {"bf16", "fp32"} <= set(best)
    model, flags = cpu_description()
    summary = {
        "tokens_per_s": {p: {arm: round(v, 1) for arm, v in b.items()} for p, b in best.items()},
        "ours_over_trainer": {p: _ratio(b, "ours", "trainer") for p, b in best.items()},
        "ours_over_trainer_per_repeat": {p: _paired(r, "ours", "trainer") for p, r in results.items()},
        "chunked_over_full_logits": {p: _ratio(b, "ours", "ours_full_logits") for p, b in best.items()},
        "ours_over_ours_mkl": {p: _ratio(b, "ours", "ours_mkl") for p, b in best.items()},
        "matmul_fp32": matmul_answer(plain, args.tokenized),
        "bf16_over_fp32": round(best["bf16"]["ours"] / best["fp32"]["ours"], 3)
        if both and "ours" in args.arms else None,
        "step_tokens_per_s": {p: round(v, 1) for p, v in steps.items()},
        "runs": {p: {arm: [round(v, 1) for v in vs] for arm, vs in r.items()}
                 for p, r in results.items()},
        "load_average_1min": [round(v, 2) for v in loads], "step_reps": args.step_reps,
        "cpu": model, "cpu_flags": flags, "cpu_has_bf16": cpu_has_bf16(),
        "steps": args.steps, "warmup": args.warmup, "repeats": args.repeats,
        "batch_size": plain.train.batch_size, "block_size": plain.model.block_size,
        "threads": torch.get_num_threads(), "torch": torch.__version__,
    }
    harness.print_json(summary)


def _ratio(best: dict[str, float], a: str, b: str) -> float | None:
    return round(best[a] / best[b], 3) if a in best and b in best else None


def _paired(runs: dict[str, list[float]], a: str, b: str) -> list[float] | None:
    """a / b of each repeat's two runs, which ran one after the other under the same load."""
    if a not in runs or b not in runs:
        return None
    return [round(x / y, 3) for x, y in zip(runs[a], runs[b], strict=True)]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--tokenized", type=Path, default=Path("data/tokenized"))
    parser.add_argument("--prepared", type=Path, default=Path("data/prepared"))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--precisions", nargs="+", choices=["fp32", "bf16"],
                        help="our loop and the Trainer, once per precision per repeat (e.g. fp32 "
                        "bf16; fp32 alone: as on an AVX2-only CPU, where auto is fp32)")
    parser.add_argument("--arms", nargs="+", choices=SIDES, default=["ours", "trainer"],
                        help="with --precisions: the loops to time, in this order per precision")
    parser.add_argument("--step-reps", type=int, default=40,
                        help="with --precisions: steps per precision in the step-by-step timing "
                        "(0: none)")
    return parser.parse_args()


def summarize(base, args: argparse.Namespace, results: dict[str, list[float]],
              loss_s: dict[str, float]) -> dict:
    """The bench's one-line JSON: best tokens/s of each side and the objectives' cost per step."""
    import torch

    from rarelm.train.precision import pick_precision

    best = {name: max(values) for name, values in results.items()}
    best.setdefault("trainer", float("nan"))
    step_s = base.train.batch_size * base.model.block_size / best["ours_plain"]
    amp_dtype, _ = pick_precision(base.train.precision, torch.device("cpu"))
    return {
        "ours_tokens_per_s": round(best["ours_plain"], 1),
        "trainer_tokens_per_s": None if math.isnan(best["trainer"]) else round(best["trainer"], 1),
        "speedup_vs_trainer": None if math.isnan(best["trainer"])
        else round(best["ours_plain"] / best["trainer"], 3),
        "rare_tokens_per_s": round(best["ours_rare"], 1),
        "terms_tokens_per_s": round(best["ours_terms"], 1),
        "rare_overhead": round((loss_s["rare_bucket"] - loss_s["plain"]) / step_s, 4),
        "terms_overhead": round((loss_s["terms"] - loss_s["plain"]) / step_s, 4),
        "objective_overhead": {name: round((v - loss_s["plain"]) / step_s, 4)
                               for name, v in loss_s.items()
                               if name not in ("plain", "rare_bucket", "terms")},
        "rare_overhead_end_to_end": round(1 - best["ours_rare"] / best["ours_plain"], 4),
        "terms_overhead_end_to_end": round(1 - best["ours_terms"] / best["ours_plain"], 4),
        "loss_ms": {name: round(v * 1e3, 3) for name, v in loss_s.items()},
        "runs": {k: [round(v, 1) for v in vs] for k, vs in results.items()},
        "steps": args.steps, "warmup": args.warmup, "batch_size": base.train.batch_size,
        "block_size": base.model.block_size, "precision": str(amp_dtype or "fp32"),
        "threads": torch.get_num_threads(),
    }


def main() -> None:
    args = parse_args()
    from rarelm.params import load_params

    base = load_params(args.params)
    train_params = dataclasses.replace(
        base.train, nproc=1, max_steps=args.steps, log_every=args.warmup, checkpoint_every=10**9,
        eval_every=10**9, eval_batches=1, warmup_steps=min(base.train.warmup_steps, args.steps))
    plain = dataclasses.replace(base, alpha=0.0, train=train_params,
                                loss=dataclasses.replace(base.loss, rare_weight=0.0),
                                tracking=dataclasses.replace(base.tracking, system_metrics=False))
    rare = dataclasses.replace(plain, alpha=0.7,
                               loss=dataclasses.replace(base.loss, rare_weight=2.0, targets="rare_bucket"))
    terms = dataclasses.replace(plain, alpha=1.0,
                                weights=dataclasses.replace(base.weights, score="terms"),
                                loss=dataclasses.replace(base.loss, rare_weight=2.0, targets="terms"))
    if args.precisions:
        compare_precisions(plain, args, args.precisions)
        return
    import importlib.util

    configs = {"ours_plain": plain, "ours_rare": rare, "ours_terms": terms}
    results: dict[str, list[float]] = {name: [] for name in [*configs, "trainer"]}
    if importlib.util.find_spec("accelerate") is None:  # transformers' Trainer needs it
        print("train_throughput: `accelerate` is not installed: Trainer skipped "
              "(pip install accelerate)", file=sys.stderr)
        del results["trainer"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp / 'mlflow.db'}"
        inputs = {name: make_inputs(args.tokenized, args.prepared, tmp, params, name)
                  for name, params in configs.items()}
        for repeat in range(args.repeats):
            for name in results:
                work = tmp / f"{name}-{repeat}"
                if name == "trainer":
                    figure = run_trainer(plain, args.tokenized, work, args.warmup)
                else:
                    figure = run_ours(configs[name], args.tokenized, *inputs[name], work, args.warmup)
                results[name].append(figure)
                print(f"{name} #{repeat + 1}: {figure:,.0f} tokens/s", flush=True)
        loss_s = loss_cost(plain, args.tokenized, inputs["ours_plain"][0])
    harness.print_json(summarize(base, args, results, loss_s))


if __name__ == "__main__":
    main()
