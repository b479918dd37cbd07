"""Stage `datastore`: the trained model's (final hidden state, next token) pairs over the train split,
the memory kNN-LM looks up at decode time (rarelm/knn/, docs/knn.md).

    python -m stages.datastore
    dvc exp run -S knn.enabled=true          # builds it, then evaluate mixes it in
    dvc exp run -S retrieval.enabled=true -S retrieval.dense=true   # builds it, evaluate retrieves by it

Writes data/datastore/ (rarelm/knn/datastore.py: keys.npy, values.npy, meta.json), atomically.
With knn.enabled and retrieval.dense false it writes meta.json alone, `{"enabled": false}`, in well
under a second: DVC needs an output, and the stage stays cheap while neither reads a store (the
continuous cache needs none: it is on with knn.cache_window and knn.cache_weight > 0). It reads
knn.enabled, retrieval.enabled and retrieval.dense, knn.similarity (cosine: unit-length keys),
knn.max_entries, knn.key_dtype, knn.index and knn.nlist (with `ivf`, also a faiss index, keys.ivf),
and eval.block_size, eval.batch_size, eval.device, eval.threads as evaluate uses them: changing k,
nprobe, the weights or the temperatures re-runs evaluate only.
"""

import time
from pathlib import Path

import typer

from rarelm import paths
from rarelm.datastore.stage import run, summary
from rarelm.errors import user_errors
from rarelm.params import load_params

app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def datastore(
    params_file: Path = typer.Option(paths.PARAMS, "--params", help="params.yaml to read"),
    model_dir: Path = typer.Option(paths.MODEL, "--model", help="model folder (any local causal LM)"),
    tokenized: Path = typer.Option(paths.TOKENIZED, help="the tokenize stage's folder"),
    out: Path = typer.Option(paths.DATASTORE, help="output folder"),
) -> None:
    """Keys (final hidden states) and values (next tokens) of the train split, for kNN-LM."""
    started = time.perf_counter()
    with user_errors("datastore"):
        params = load_params(params_file, hold=True)  # outputs refused if it changes meanwhile
        meta = run(params, model_dir, tokenized, out)
    print(summary(meta, time.perf_counter() - started))


if __name__ == "__main__":
    app()
