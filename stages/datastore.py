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
from rarelm.errors import RarelmError, user_errors
from rarelm.files import atomic_dir, write_json
from rarelm.knn import needs_store
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
        if not needs_store(params):
            with atomic_dir(out) as tmp:
                write_json(tmp / "meta.json", {"enabled": False})
            print("datastore: knn.enabled and retrieval.dense are false: an empty marker, nothing built")
            return
        meta = _build(params, model_dir, tokenized, out)
    index = f", IVF index of {meta['nlist']} clusters" if "nlist" in meta else ""
    print(f"datastore: {meta['entries']:,} entries of {meta['hidden']} {meta['key_dtype']} from the train "
          f"split{index}, {time.perf_counter() - started:.1f} s")


def _build(params, model_dir: Path, tokenized: Path, out: Path) -> dict:
    # on use: torch and transformers take seconds to import
    import torch
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from rarelm.artifacts.tokenized import TokenizedData, lead_ids, load_tokenizer
    from rarelm.evaluate.decoding import context_length
    from rarelm.evaluate.model_folder import load_causal_lm
    from rarelm.evaluate.prefix import window
    from rarelm.knn.datastore import build

    if params.eval.threads:
        torch.set_num_threads(params.eval.threads)
    data = TokenizedData.open(tokenized)
    tokens = data.tokens("train")
    model = load_causal_lm(model_dir, params.eval.device)
    vocab = getattr(model.config, "vocab_size", None)
    if isinstance(vocab, int) and vocab < data.vocab_size:
        raise RarelmError(f"{model_dir}: the model's vocabulary ({vocab}) is smaller than the "
                          f"tokenizer's ({data.vocab_size}); was it trained on this data?")
    limit = context_length(model)
    lead = lead_ids(load_tokenizer(data.tokenizer_dir, data.vocab_size))  # <bos> first, as evaluate reads
    block = window(params.eval.block_size, limit, len(lead))  # fits with the lead, or a RarelmError
    total = max(len(tokens) - 1, 0)
    if params.knn.max_entries:
        total = min(total, params.knn.max_entries)
    console = Console(stderr=True)  # stdout holds only the summary line
    columns = [TextColumn("datastore: {task.description}"), BarColumn(),
               TextColumn("{task.completed}/{task.total}"), TimeRemainingColumn()]
    with Progress(*columns, console=console, transient=True, disable=not console.is_terminal) as bar, \
            atomic_dir(out) as tmp:
        task = bar.add_task("train entries", total=total)
        meta = build(model, tokens, block, params.eval.batch_size, tmp, params.knn.key_dtype,
                     params.knn.max_entries, lambda n: bar.advance(task, n), params.knn.index,
                     params.knn.nlist, params.knn.similarity, lead)
        write_json(tmp / "meta.json", meta)
    return meta


if __name__ == "__main__":
    app()
