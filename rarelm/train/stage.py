"""The `train` stage, start to end (see stages/train.py): check params and inputs, then either
launch `train.nproc` workers through torchrun (rarelm/train/launch.py) or, as a worker or alone,
train (rarelm/train/loop.py), which writes the model, metrics and curves itself."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from rarelm.train import lora, report
from rarelm.train.bounds import check_batch_fits
from rarelm.train.checkpoint import signing_key
from rarelm.train.inputs import Paths, load_inputs
from rarelm.train.launch import launch, quiet_exit, worker_argv
from rarelm.train.model import check_pretrained
from rarelm.train.sharding import check_world_size


def run(params, params_file: Path, paths: Paths, progress: bool = True) -> tuple[int, Any]:
    """(exit code, rank 0's train metrics or None). Run plainly with train.nproc > 1 it checks
    once what every worker would refuse, then launches them: their exit code. As a torchrun
    worker or with one process it trains; a worker whose failure another process reports ends
    with exit 2 (`quiet_exit`). `params` is the full Params; `params_file` is passed on to workers."""
    worker = "LOCAL_RANK" in os.environ
    # a micro-batch that cannot fit, refused before anything is allocated
    check_batch_fits(params, int(os.environ.get("LOCAL_WORLD_SIZE", params.train.nproc)),
                     cpu=not torch.cuda.is_available())
    if not worker:  # under torchrun, each worker checks the world size it is in
        check_world_size(params.train.strategy, params.train.nproc)
        lora.check(params.model)  # before the workers: one line, not a race of them
    if not worker and params.train.nproc > 1:
        inputs = load_inputs(params, paths)  # bad inputs: one line from here, not per worker
        if params.model.name_or_path:  # what every worker would refuse, refused once here
            check_pretrained(params.model, inputs.data)
        signing_key(paths.cache)  # a key others can read or wrote: refused here, once
        return launch(params.train.nproc, params.train.max_restarts,
                      worker_argv(params_file, paths, progress)), None
    try:
        from rarelm.train.loop import train

        return 0, train(params, paths, progress=progress)
    except Exception as exc:  # a bad input or a full disk: rank 0 says it once for everyone
        if quiet_exit(exc):
            return 2, None
        raise


def summary(result: dict[str, Any], paths: Paths) -> str:
    """The stage's one summary line (rarelm/train/report.py)."""
    return report.summary(result, paths)
