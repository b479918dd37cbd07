"""Process CPU time of one training step: our loop against transformers' Trainer, per step.

    OMP_NUM_THREADS=1 RARELM_CPU_BF16=0 python bench/train_cpu_time.py [--shape demo|base] \
        [--arms ours trainer ours_mkl] [--steps 30] [--warmup 8] [--repeats 2]

Each arm trains as bench/train_throughput.py runs it (bench/train_runs.run_side: `ours`,
rarelm.train.loop.train, one process; `trainer`, the Trainer as its users run it; `ours_mkl`, our
loop with its fp32 products by MKL, `RARELM_MATMUL=mkl`), on the demo's data (`--tokenized`,
`--prepared`) or at the base's shape (base/model, the prepared text tokenized with its tokenizer
into `--work`). A clock reads `time.process_time()` after every optimizer step (our loop's
`train_step`, the Trainer's `on_step_end`); each figure is the median over the steps after
`--warmup` of the CPU time between two steps, which other load on a shared machine inflates far less
than wall time (a process waiting for a core spends no CPU time). The wall-clock median is printed
beside it. With more than one thread, CPU time adds up every thread's (spinning included): use one
thread.

Worked example of a line: `ours demo fp32: 137.6 ms CPU a step (22 steps), 14,885 tokens per
CPU-second; wall 180.8 ms a step (load 3.84)`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from pathlib import Path

import numpy as np
from train_runs import SHAPES, make_inputs, run_side, shape_params, tokenize_with_base


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--shape", choices=["demo", "base"], default="demo")
    parser.add_argument("--tokenized", type=Path, default=Path("data/tokenized"))
    parser.add_argument("--prepared", type=Path, default=Path("data/prepared"))
    parser.add_argument("--work", type=Path, help="keep the data made here (and reuse it)")
    parser.add_argument("--arms", nargs="+", choices=["ours", "trainer", "ours_mkl"],
                        default=["ours", "trainer"])
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1)
    return parser.parse_args()


def main() -> None:
    args = _args()
    import transformers

    from rarelm.params import load_params
    from rarelm.train import loop

    base = load_params(args.params)
    train = dataclasses.replace(
        base.train, nproc=1, max_steps=args.steps, log_every=args.warmup, checkpoint_every=10**9,
        eval_every=10**9, eval_batches=1, warmup_steps=min(base.train.warmup_steps, args.steps),
        precision=args.precision)
    plain = dataclasses.replace(base, alpha=0.0, train=train,
                                loss=dataclasses.replace(base.loss, rare_weight=0.0),
                                tracking=dataclasses.replace(base.tracking, system_metrics=False))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = args.work or tmp
        os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp / 'mlflow.db'}"
        tokenized, params = args.tokenized, plain
        if args.shape == "base":
            tokenized = data / "tokenized"
            if not (tokenized / "meta.json").exists():
                tokenize_with_base(args.prepared, tokenized)
            params = shape_params(plain, SHAPES["base"], args.steps, args.warmup)
        rare, weights = make_inputs(tokenized, args.prepared, data, params, "plain")

        cpu: list[float] = []
        wall: list[float] = []

        def tick() -> None:
            cpu.append(time.process_time())
            wall.append(time.perf_counter())

        step = loop.train_step

        def timed_step(*a, **k):
            out = step(*a, **k)
            tick()
            return out

        class Clock(transformers.TrainerCallback):
            def on_step_end(self, *a, **k):
                tick()

        trainer_init = transformers.Trainer.__init__

        def with_clock(self, *a, callbacks=None, **k):
            trainer_init(self, *a, callbacks=[*(callbacks or []), Clock()], **k)

        loop.train_step, transformers.Trainer.__init__ = timed_step, with_clock
        tokens = params.train.batch_size * params.model.block_size
        for repeat in range(args.repeats):
            for arm in args.arms:
                cpu.clear()
                wall.clear()
                work = tmp / f"{arm}-{repeat}"
                run_side(arm, params, tokenized, rare, weights, work, args.warmup)
                per_step = np.diff(cpu[args.warmup - 1:])
                per_wall = np.diff(wall[args.warmup - 1:])
                print(f"{arm} {args.shape} {args.precision}: {np.median(per_step) * 1e3:.1f} ms CPU a "
                      f"step ({len(per_step)} steps), {tokens / np.median(per_step):,.0f} tokens per "
                      f"CPU-second; wall {np.median(per_wall) * 1e3:.1f} ms a step "
                      f"(load {os.getloadavg()[0]:.2f})", flush=True)


if __name__ == "__main__":
    main()
