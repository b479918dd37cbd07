"""Cost of kNN-LM (rarelm/knn/): datastore write and exact search per million entries, and with a
model, the datastore build rate and teacher-forced scoring with the mix against without.

Synthetic part: `--entries` clustered float16 keys of `--hidden` dimensions written as the
datastore stage writes them (memory-mapped .npy, in chunks), then `--queries` queries searched
exactly for their `--k` nearest (rarelm.knn.datastore.Datastore.search: chunked matmul + running
top-k); where faiss-cpu is importable (not a dependency), also its exact IndexFlatL2 and an
IndexIVFFlat with its recall against the exact neighbours: the exact-vs-index crossover.
Model part (`--model`): `--tokens` random token ids run through the model as the stage does
(build: final hidden states -> keys), then score_tokens on the same ids with and without the mix
(kNN over that store at `--k`, plus a cache of `--cache-window`), one thread as eval.threads.
With `--text` (a corpus, .gz or plain, tokenized by the model's tokenizer): the store is its first
`--tokens` tokens and the scored text the `--score-tokens` after them, as a train split's store
serves a held-out split; the IVF recall is then measured on that text's own hidden states.

    python bench/knn.py --entries 1000000 --hidden 128 --queries 2048
    PYTHONPATH=/tmp/faiss_pkg python bench/knn.py --entries 100000   # pip install --target /tmp/faiss_pkg
    python bench/knn.py --entries 1000000 --hidden 128 --queries 2048 --model base/model --tokens 20000
    python bench/knn.py --entries 0 --model base/model --tokens 20000 --index ivf --cache-window 0
    python bench/knn.py --entries 0 --model base/model --index ivf \
        --text data/raw/foldoc_en.txt.gz --tokens 500000 --score-tokens 20000
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def synthetic(folder: Path, entries: int, hidden: int, queries: int, k: int) -> dict:
    """Write a store of clustered keys (4,096 centres + unit noise: hidden states are not uniform
    noise, and an IVF index is only worth measuring on data with structure), search it exactly;
    with faiss importable, also faiss's exact IndexFlatL2 and an IndexIVFFlat (recall against exact)."""
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((4096, hidden), dtype=np.float32) * 3
    started = time.perf_counter()
    keys = np.lib.format.open_memmap(folder / "keys.npy", mode="w+", dtype=np.float16,
                                     shape=(entries, hidden))
    for s in range(0, entries, 65536):
        rows = min(65536, entries - s)
        keys[s:s + rows] = centres[rng.integers(0, 4096, rows)] + rng.standard_normal((rows, hidden),
                                                                                      dtype=np.float32)
    keys.flush()
    del keys
    np.save(folder / "values.npy", rng.integers(0, 8000, entries).astype(np.int32))
    write_s = time.perf_counter() - started
    from rarelm.knn.datastore import Datastore

    # values = entry ids here, so the exact neighbours can be compared with faiss's by id
    store = Datastore(np.load(folder / "keys.npy", mmap_mode="r"), torch.arange(entries))
    q = centres[rng.integers(0, 4096, queries)] + rng.standard_normal((queries, hidden), dtype=np.float32)
    store.search(torch.as_tensor(q[:8]), k)  # warm the page cache, torch and the key norms
    started = time.perf_counter()
    _, exact = store.search(torch.as_tensor(q), k)
    search_s = time.perf_counter() - started
    million = entries / 1e6
    out = {"entries": entries, "hidden": hidden, "queries": queries, "k": k,
           "disk_mb": round(sum((folder / f).stat().st_size for f in ("keys.npy", "values.npy")) / 2**20, 1),
           "write_s": round(write_s, 2), "write_s_per_1m": round(write_s / million, 2),
           "search_s": round(search_s, 2), "search_ms_per_query": round(1e3 * search_s / queries, 3),
           "search_ms_per_query_per_1m": round(1e3 * search_s / queries / million, 3)}
    out.update(_faiss(np.load(folder / "keys.npy", mmap_mode="r"), q, k, exact.numpy(), rng))
    return out


def _faiss(keys: np.ndarray, q: np.ndarray, k: int, exact: np.ndarray, rng) -> dict:
    """faiss-cpu's exact and IVF search on the same keys, if faiss is importable (not a dependency:
    `pip install faiss-cpu==1.15.1`); nlist = 4 sqrt(entries), trained on 64 points a list."""
    try:
        import faiss
    except ImportError:
        return {"faiss": "not installed"}
    faiss.omp_set_num_threads(torch.get_num_threads())
    n, d = keys.shape
    out = {"faiss": faiss.__version__}
    started = time.perf_counter()
    flat = faiss.IndexFlatL2(d)
    for s in range(0, n, 65536):
        flat.add(np.asarray(keys[s:s + 65536], dtype=np.float32))
    out["faiss_flat_build_s"] = round(time.perf_counter() - started, 2)
    started = time.perf_counter()
    flat.search(q, k)
    out["faiss_flat_ms_per_query"] = round(1e3 * (time.perf_counter() - started) / len(q), 3)
    nlist = int(4 * np.sqrt(n))
    started = time.perf_counter()
    ivf = faiss.IndexIVFFlat(faiss.IndexFlatL2(d), d, nlist)
    ivf.train(np.asarray(keys[np.sort(rng.choice(n, min(n, 64 * nlist), replace=False))], dtype=np.float32))
    for s in range(0, n, 65536):
        ivf.add(np.asarray(keys[s:s + 65536], dtype=np.float32))
    out.update(ivf_nlist=nlist, ivf_build_s=round(time.perf_counter() - started, 2))
    for nprobe in (8, 32):
        ivf.nprobe = nprobe
        started = time.perf_counter()
        _, found = ivf.search(q, k)
        out[f"ivf_nprobe{nprobe}_ms_per_query"] = round(1e3 * (time.perf_counter() - started) / len(q), 3)
        out[f"ivf_nprobe{nprobe}_recall_at_k"] = round(float(np.mean(
            [len(set(a) & set(b)) / k for a, b in zip(found, exact, strict=True)])), 3)
    return out


def text_ids(path: Path, model_dir: Path, needed: int) -> np.ndarray:
    """The first `needed` token ids of a corpus (.gz or plain text) in the model's tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    ids: list[int] = []
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt", encoding="utf-8") as f:
        for line in f:
            ids += tokenizer.encode(line, add_special_tokens=False)
            if len(ids) >= needed:
                break
    if len(ids) < needed:
        raise SystemExit(f"{path}: {len(ids)} tokens, fewer than the {needed} asked for")
    return np.asarray(ids[:needed], dtype=np.int64)


def with_model(folder: Path, model_dir: Path, tokens: int, k: int, cache_window: int, index: str = "exact",
               nprobe: int = 8, text: Path | None = None, score_tokens_n: int = 20_000,
               knn_weight: float = 0.25) -> dict:
    from rarelm.evaluate.common import EvalContext
    from rarelm.evaluate.decoding import context_length
    from rarelm.evaluate.model_folder import load_causal_lm
    from rarelm.evaluate.token_scoring import score_tokens
    from rarelm.knn.datastore import Datastore, build
    from rarelm.knn.hook import attached
    from rarelm.params import EvalParams, KnnParams

    model = load_causal_lm(model_dir, "cpu")
    vocab, block = model.config.vocab_size, context_length(model) or 128
    if text is None:  # random ids, scored against their own store
        ids = scored = np.random.default_rng(1).integers(1, vocab, tokens).astype(np.uint16)
    else:  # the store from the text's start, the scored text after it
        both = text_ids(text, model_dir, tokens + score_tokens_n)
        ids, scored = both[:tokens], both[tokens:]
    started = time.perf_counter()
    if knn_weight > 0:
        meta = build(model, ids, block, 32, folder, "float16", index=index)
        (folder / "meta.json").write_text(json.dumps(meta))
    else:  # the cache alone: no store (knn.enabled false)
        meta = {"entries": 0, "hidden": model.get_output_embeddings().weight.shape[1]}
    build_s = time.perf_counter() - started
    store = Datastore.open(folder, nprobe=nprobe) if knn_weight > 0 else None
    buckets = np.zeros(vocab, dtype=np.int64)
    ctx = EvalContext(model, None, 0, EvalParams(batch_size=32))
    started = time.perf_counter()
    score_tokens(ctx, scored, buckets, block)
    plain_s = time.perf_counter() - started
    knn = KnnParams(enabled=knn_weight > 0, k=k, weight=knn_weight, temperature=1.0,
                    cache_window=cache_window, cache_weight=0.1 if cache_window else 0.0,
                    cache_temperature=1.0)
    with attached(model, store, knn, 0):
        started = time.perf_counter()
        score_tokens(ctx, scored, buckets, block)
        mixed_s = time.perf_counter() - started
    recall = {}
    if index == "ivf" and store is not None:  # the IVF neighbours against the exact ones
        import dataclasses

        from rarelm.knn.datastore import final_hidden

        probe = torch.as_tensor(np.random.default_rng(2).integers(1, vocab, (8, block)) if text is None
                                else scored[:8 * block].reshape(8, block))
        queries = final_hidden(model, probe).reshape(-1, meta["hidden"])
        exact_store = dataclasses.replace(store, ivf=None, values=torch.arange(len(store)))
        ivf_store = dataclasses.replace(store, values=torch.arange(len(store)))
        exact_ids = exact_store.search(queries, k)[1].tolist()
        ivf_ids = ivf_store.search(queries, k)[1].tolist()
        recall["ivf_recall_at_k"] = round(float(np.mean([len(set(a) & set(b)) / len(a) for a, b in
                                                         zip(exact_ids, ivf_ids, strict=True)])), 3)
    return {**recall, "model": str(model_dir), "hidden": meta["hidden"], "tokens": tokens,
            "text": str(text) if text else "random ids", "scored_tokens": len(scored),
            "store_entries": meta["entries"],
            "build_s": round(build_s, 2),
            "build_tokens_per_s": round(tokens / build_s) if meta["entries"] else 0,
            "score_plain_s": round(plain_s, 2), "score_mixed_s": round(mixed_s, 2),
            "mixed_over_plain": round(mixed_s / plain_s, 2), "k": k, "knn_weight": knn_weight,
            "cache_window": cache_window,
            "index": index, **({"nlist": meta["nlist"], "nprobe": nprobe} if index == "ivf" else {})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--queries", type=int, default=2048)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--tokens", type=int, default=20_000, help="the model part's store, in tokens")
    parser.add_argument("--text", type=Path, default=None, help="a corpus for the store and the scored text")
    parser.add_argument("--score-tokens", type=int, default=20_000, help="with --text: tokens scored")
    parser.add_argument("--cache-window", type=int, default=64)
    parser.add_argument("--index", choices=["exact", "ivf"], default="exact", help="the model part's store")
    parser.add_argument("--nprobe", type=int, default=8)
    parser.add_argument("--knn-weight", type=float, default=0.25,
                        help="lambda of kNN-LM; 0: the cache alone, no store built")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (eval.threads' default: 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    out = {"cpu": platform.processor() or platform.machine(), "threads": args.threads,
           "load_1min": round(os.getloadavg()[0], 2),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    with tempfile.TemporaryDirectory() as tmp:
        if args.entries:
            out["synthetic"] = synthetic(Path(tmp), args.entries, args.hidden, args.queries, args.k)
        if args.model:
            folder = Path(tmp) / "model_store"
            folder.mkdir()
            out["model"] = with_model(folder, args.model, args.tokens, args.k, args.cache_window, args.index,
                                      args.nprobe, args.text, args.score_tokens, args.knn_weight)
    out["load_1min_after"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
