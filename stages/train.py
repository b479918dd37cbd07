"""Stage `train`: tokenized data + rare buckets + sample weights -> a trained model.

    python -m stages.train                 # what dvc.yaml runs: starts torchrun itself
    torchrun --standalone --nproc-per-node 2 -m stages.train     # the same, by hand

Run plainly, it checks params and inputs, then launches `train.nproc` worker
processes through torchrun's own launcher (torch.distributed.run, a one-node
rendezvous listening on 127.0.0.1 only, `train.max_restarts` restarts; a restarted
worker resumes from the last checkpoint; rarelm/train/launch.py). Run under torchrun
(multi-node: one torchrun per node with rendezvous params, see README), it is a worker:
rarelm.train.loop does the work.

Writes models/model/ (Hugging Face format + tokenizer + mlflow_run.json),
metrics/train.json and plots/train.csv; checkpoints go to .cache/train/<key>/.
"""

import os
from pathlib import Path

import typer

from rarelm import paths
from rarelm.errors import user_errors
from rarelm.params import load_params

app = typer.Typer(add_completion=False, help=__doc__)


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
    from rarelm.train.inputs import Paths
    from rarelm.train.stage import run, summary

    paths = Paths(tokenized=tokenized, rare=rare, weights=weights, model=out, metrics=metrics,
                  plots=plots, metrics_dir=metrics.parent, cache=cache)
    with user_errors("train"):
        params = load_params(params_file, hold=True)  # outputs refused if it changes meanwhile
        code, result = run(params, params_file, paths, progress=progress)
    if code:  # the launcher: its workers' exit code; a worker: another process says why
        raise typer.Exit(code)
    if result is not None:  # rank 0
        print(summary(result, paths), flush=True)


if __name__ == "__main__":
    if "LOCAL_RANK" in os.environ:  # a torchrun worker: its exit must not race gloo's threads
        from rarelm.train.dist import end_worker

        end_worker(app)
    app()
