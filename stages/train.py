"""Stage `train`: tokenized data + rare buckets + sample weights -> a trained model.

    python -m stages.train                 # what dvc.yaml runs: starts torchrun itself
    torchrun --standalone --nproc-per-node 2 -m stages.train     # the same, by hand

Run plainly, it checks params and inputs, then launches `train.nproc` worker
processes through torchrun's own launcher (torch.distributed.run, a one-node
rendezvous listening on 127.0.0.1 only, `train.max_restarts` restarts; a restarted
worker resumes from the last checkpoint). Run under torchrun (multi-node: one torchrun per node with
rendezvous params, see README), it is a worker: rarelm.train.loop does the work.

Writes models/model/ (Hugging Face format + tokenizer + mlflow_run.json),
metrics/train.json and plots/train.csv; checkpoints go to .cache/train/<key>/.
"""

import logging
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import typer

from rarelm import paths
from rarelm.errors import ERROR_DIR_ENV, error_line, first_worker_error, leave_for_launcher, user_errors
from rarelm.files import remove_stale_folders
from rarelm.params import load_params

app = typer.Typer(add_completion=False, help=__doc__)
EVERY_RANK_WAIT_S = 120  # at most: rank 0 exits within seconds of the others
ERRORS_PREFIX = "rarelm-train-errors-"  # the launcher's folder for its workers' error lines: <prefix><pid>-*


def _launch(nproc: int, max_restarts: int, argv: list[str]) -> int:
    """Run this module under torchrun's launcher with `nproc` workers; their exit code."""
    # on use: torch takes seconds to import, which every `rarelm` command would pay
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    from rarelm.train import loopback

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (cores or 1) // nproc)))
    # Restarted workers (train.max_restarts) must not rendezvous through the agent's shared
    # store: they can read the previous attempt's gloo addresses and hang or fail to connect
    # (pytorch/pytorch#135712). A store of their own per attempt avoids it.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    # The workers' one-line errors are printed below (or by a worker, for a traceback); the
    # launcher's logging would add a traceback-sized report for the same failure.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    # one node: torchrun's rendezvous, its agent and the workers on 127.0.0.1 only, where
    # `--standalone` listens on every interface (rarelm.train.loopback)
    loopback.register_rendezvous()
    args = get_args_parser().parse_args(
        [*loopback.launcher_args(nproc, str(uuid.uuid4())), "--max-restarts", str(max_restarts),
         "-m", "stages.train", *argv])
    # The workers leave their one-line errors here and this launcher prints the first rank's:
    # torchrun stops all workers once one fails, often before rank 0 has printed anything.
    # Named by this launcher's pid: a launcher killed with SIGKILL cannot remove its folder; the
    # next one removes those whose launcher is gone.
    remove_stale_folders(Path(tempfile.gettempdir()), ERRORS_PREFIX)
    with tempfile.TemporaryDirectory(prefix=f"{ERRORS_PREFIX}{os.getpid()}-") as folder:
        os.environ[ERROR_DIR_ENV] = folder
        try:
            run(args)
        except ChildFailedError as exc:
            if line := first_worker_error(Path(folder)):
                print(line, file=sys.stderr, flush=True)
            code = exc.get_first_failure()[1].exitcode
            return code if code > 0 else 128 - code  # killed by signal N: 128 + N, like a shell
        except SignalException as exc:  # SIGTERM/SIGINT: torchrun has stopped the workers
            return 128 + int(exc.sigval)
        finally:
            os.environ.pop(ERROR_DIR_ENV, None)
    return 0


def _peer_gone(exc: BaseException) -> bool:
    """Whether a collective failed because another worker ended (gloo: its connection closed).

    >>> _peer_gone(RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:4509."))
    True
    """
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(
        s in text for s in ("Connection closed by peer", "Connection reset by peer"))


@app.command()
def train(
    params_file: Path = typer.Option(paths.PARAMS, "--params", help="params.yaml to read"),
    tokenized: Path = typer.Option(paths.TOKENIZED, help="the tokenize stage's folder"),
    rare: Path = typer.Option(paths.RARE, help="the rare_terms stage's folder"),
    weights: Path = typer.Option(paths.WEIGHTS, help="the weights stage's folder"),
    out: Path = typer.Option(paths.MODEL, help="output model folder"),
    metrics: Path = typer.Option(paths.TRAIN_METRICS, help="metrics file"),
    plots: Path = typer.Option(paths.TRAIN_PLOT, help="step-wise curves"),
    cache: Path = typer.Option(paths.TRAIN_CACHE, help="checkpoint folder (outside DVC outs)"),
    progress: bool = typer.Option(True, help="show the progress bar"),
) -> None:
    """Train the model (DDP or FSDP over train.nproc processes), resuming from a checkpoint if any."""
    # on use: torch and transformers take seconds to import, which every `rarelm` command would pay
    import torch

    from rarelm.train import lora
    from rarelm.train.bounds import check_batch_fits
    from rarelm.train.checkpoint import signing_key
    from rarelm.train.dist import EveryRankError
    from rarelm.train.inputs import Paths, load_inputs
    from rarelm.train.model import check_pretrained
    from rarelm.train.report import summary
    from rarelm.train.sharding import check_world_size

    paths = Paths(tokenized=tokenized, rare=rare, weights=weights, model=out, metrics=metrics,
                  plots=plots, metrics_dir=metrics.parent, cache=cache)
    worker = "LOCAL_RANK" in os.environ
    with user_errors("train"):
        params = load_params(params_file, hold=True)  # outputs refused if it changes meanwhile
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
            signing_key(cache)  # a key others can read or wrote: refused here, once
            argv = ["--params", str(params_file), "--tokenized", str(tokenized), "--rare", str(rare),
                    "--weights", str(weights), "--out", str(out), "--metrics", str(metrics),
                    "--plots", str(plots), "--cache", str(cache),
                    "--progress" if progress else "--no-progress"]
            raise typer.Exit(_launch(params.train.nproc, params.train.max_restarts, argv))
        try:
            from rarelm.train.loop import train as run_training

            result = run_training(params, paths, progress=progress)
        except Exception as exc:  # a bad input or a full disk: rank 0 says it once for everyone
            line = error_line("train", exc)
            if os.environ.get(ERROR_DIR_ENV) and _peer_gone(exc):  # the rank that ended first
                raise typer.Exit(2) from None  # says why (its line, or its traceback if a bug)
            if int(os.environ.get("RANK", "0")) != 0 and line is not None:
                if os.environ.get(ERROR_DIR_ENV):  # our launcher prints the lowest rank's line
                    leave_for_launcher(Path(os.environ[ERROR_DIR_ENV]), line)
                if isinstance(exc, EveryRankError):  # rank 0 raised it too: let it say so first
                    time.sleep(EVERY_RANK_WAIT_S)  # (torchrun stops this worker when rank 0 exits)
                raise typer.Exit(2) from None
            raise
    if result is not None:
        print(summary(result, paths), flush=True)


if __name__ == "__main__":
    if "LOCAL_RANK" in os.environ:  # a torchrun worker: its exit must not race gloo's threads
        from rarelm.train.dist import end_worker

        end_worker(app)
    app()
