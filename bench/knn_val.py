"""kNN-LM and the cache on a real corpus's val split: perplexity of the first `--val-tokens` val tokens
with the plain model, the cache alone, kNN alone and both, over a small grid of lambda and T
(val only: nothing here looks at test). A first look, not the headline: one model, one store
(`--entries` train targets from the split's start), no term metrics.

    # prepare + tokenize foldoc_en with base/model's tokenizer into /tmp/knn_foldoc (docs/knn.md), then
    .venv/bin/python bench/knn_val.py --data /tmp/knn_foldoc/tokenized --model base/model \
        --entries 200000 --val-tokens 20000
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, required=True, help="a tokenize stage's folder")
    parser.add_argument("--model", type=Path, default=Path("base/model"))
    parser.add_argument("--entries", type=int, default=200_000)
    parser.add_argument("--val-tokens", type=int, default=20_000)
    parser.add_argument("--index", choices=["exact", "ivf"], default="ivf")
    parser.add_argument("--nprobe", type=int, default=32)
    parser.add_argument("--lambdas", default="0.1,0.25", help="kNN lambdas, comma-separated")
    parser.add_argument("--temperatures", default="1,10,100", help="kNN temperatures, comma-separated")
    parser.add_argument("--with-cache", default="", help="LAMBDA,T: also each kNN setting plus this cache")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from rarelm.artifacts.tokenized import TokenizedData
    from rarelm.evaluate.common import EvalContext
    from rarelm.evaluate.model_folder import load_causal_lm
    from rarelm.evaluate.token_scoring import score_tokens
    from rarelm.knn.datastore import Datastore, build
    from rarelm.knn.hook import attached
    from rarelm.params import EvalParams, KnnParams

    data = TokenizedData.open(args.data)
    model = load_causal_lm(args.model, "cpu")
    block = model.config.n_positions
    val = np.asarray(data.tokens("val")[:args.val_tokens])
    buckets = np.zeros(data.vocab_size, dtype=np.int64)
    out = {"load_1min": round(os.getloadavg()[0], 2),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "model": str(args.model), "entries": args.entries, "val_tokens": len(val), "index": args.index}
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        meta = build(model, data.tokens("train"), block, 32, Path(tmp), "float16", args.entries,
                     index=args.index)
        (Path(tmp) / "meta.json").write_text(json.dumps(meta))
        out["build_s"] = round(time.perf_counter() - started, 1)
        store = Datastore.open(tmp, nprobe=args.nprobe)
        rows = []

        def score(name: str, **knn) -> None:
            settings = KnnParams(**{"enabled": True, "k": 16, "weight": 0.0, "temperature": 1.0,
                                    "cache_window": 0, "cache_weight": 0.0, "cache_temperature": 1.0, **knn})
            started = time.perf_counter()
            with attached(model, store, settings, data.eot_id):
                ppl = score_tokens(EvalContext(model, None, 0, EvalParams(batch_size=32)), val, buckets,
                                   block).metrics()["ppl"]
            seconds = round(time.perf_counter() - started, 1)
            rows.append({"setting": name, **knn, "ppl": round(ppl, 3), "s": seconds})
            print(json.dumps(rows[-1]), flush=True)

        score("plain")
        for lam in map(float, args.lambdas.split(",")):
            for temp in map(float, args.temperatures.split(",")):
                score("knn", weight=lam, temperature=temp)
                if args.with_cache:
                    c_lam, c_temp = map(float, args.with_cache.split(","))
                    score("knn+cache", weight=lam, temperature=temp, cache_window=128, cache_weight=c_lam,
                          cache_temperature=c_temp)
        for temp in (1.0, 10.0):
            score("cache", cache_window=128, cache_weight=0.1, cache_temperature=temp)
    out["rows"] = rows
    print(json.dumps(out))


if __name__ == "__main__":
    main()
