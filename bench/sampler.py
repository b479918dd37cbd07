"""Benchmark: rarelm's WeightedDistributedSampler against torch's WeightedRandomSampler.

    .venv/bin/python bench/sampler.py                       # sizes 1e4 1e6 1e7, plus 2^24 + 2^20
    .venv/bin/python bench/sampler.py --sizes 10000 --big 0 # quick

For each size n: n random weights, one epoch of about n samples. Ours draws as
training does (`block_size` 128, epoch 1, so the windows are shifted and their
weights blended, then systematic resampling, shuffle, shard of one rank); torch
draws n indices independently with replacement. Timed as `list(sampler)` (what
a DataLoader consumes) and, for ours, also as the int64 array `sampler.starts()`.
Best of `--repeat` runs. Above 2^24 weights only ours runs (torch.multinomial
refuses that many categories; the error is recorded). One line per size, then
one JSON line last.
"""

from __future__ import annotations

import argparse
import os
import platform

import harness
import numpy as np
import torch
from torch.utils.data import WeightedRandomSampler

from rarelm.train.sampler import WeightedDistributedSampler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 1_000_000, 10_000_000])
    parser.add_argument("--big", type=int, default=2**24 + 2**20, help="size for ours alone; 0 = skip")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--block-size", type=int, default=128)
    args = parser.parse_args()

    rows = []
    for n in [*args.sizes, *([args.big] if args.big else [])]:
        weights = np.random.default_rng(0).random(n)
        repeat = args.repeat if n <= 1_000_000 else 1
        ours = WeightedDistributedSampler(weights, seed=0, block_size=args.block_size)
        ours.set_epoch(1)  # an epoch with shifted windows: the blend is part of the cost
        row = {"n": n,
               "ours_list_s": harness.best_of(repeat, lambda s=ours: list(s)),
               "ours_starts_s": harness.best_of(repeat, ours.starts)}
        try:
            theirs = WeightedRandomSampler(torch.from_numpy(weights), num_samples=n)
            row["torch_list_s"] = harness.best_of(repeat, lambda s=theirs: list(s))
            row["speedup"] = row["torch_list_s"] / row["ours_list_s"]
        except RuntimeError as exc:
            row["torch_error"] = " ".join(str(exc).split())[:120]
        rows.append(row)
        print(" ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
              flush=True)
    harness.print_json({"bench": "sampler", "machine": f"{platform.machine()} {os.cpu_count()} CPUs",
                        "torch_threads": torch.get_num_threads(), "block_size": args.block_size,
                        "results": rows})


if __name__ == "__main__":
    main()
