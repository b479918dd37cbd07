"""The `datastore` stage, start to end: the trained model's (final hidden state, next token) pairs
over the train split, written to data/datastore/ (see stages/datastore.py; the arrays are
rarelm/knn/datastore.py's). `run` writes the folder atomically; `summary` is its line."""

from __future__ import annotations

from pathlib import Path

from rarelm.errors import RarelmError
from rarelm.files import atomic_dir, write_json
from rarelm.knn import needs_store


def run(params, model_dir: Path, tokenized: Path, out: Path) -> dict:
    """Write the store to `out` (keys.npy, values.npy, meta.json), or meta.json alone,
    `{"enabled": false}`, where nothing reads a store (`rarelm.knn.needs_store`); returns meta.json's
    content. `params` is the full Params (`knn`, `retrieval`, `eval`)."""
    if not needs_store(params):
        meta = {"enabled": False}
        with atomic_dir(out) as tmp:
            write_json(tmp / "meta.json", meta)
        return meta
    return build_store(params, model_dir, tokenized, out)


def summary(meta: dict, seconds: float) -> str:
    """The stage's one summary line, `seconds` its time."""
    if not meta.get("enabled"):
        return "datastore: knn.enabled and retrieval.dense are false: an empty marker, nothing built"
    index = f", IVF index of {meta['nlist']} clusters" if "nlist" in meta else ""
    return (f"datastore: {meta['entries']:,} entries of {meta['hidden']} {meta['key_dtype']} from the train "
            f"split{index}, {seconds:.1f} s")


def build_store(params, model_dir: Path, tokenized: Path, out: Path) -> dict:
    """The store of the model at `model_dir` over the tokenized train split, written to `out`
    atomically, with a progress bar on a terminal; returns meta.json's content."""
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
