"""How close a model's states come to a kNN-LM datastore: the nearest key's cosine (knn.gate_cosine's
input) on in-domain text against general text, as quantiles; where to put the gate's c0.

    .venv/bin/python bench/knn_gate_cosines.py --model smollm2/model --store <datastore folder>/out \
        --tokenized <tokenize folder>/out --split val --general data/general/en.txt --tokens 4096

Reads: the model folder, the datastore stage's folder (similarity cosine), the tokenize stage's
folder; prints one line per text. Choosing c0 from these quantiles uses no outcome of any run.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from rarelm.artifacts.tokenized import TokenizedData, load_tokenizer
from rarelm.evaluate.model_folder import load_causal_lm
from rarelm.knn.datastore import Datastore, final_hidden


def nearest_cosines(model, store: Datastore, tokens: np.ndarray, block: int) -> np.ndarray:
    out = []
    for start in range(0, len(tokens) - 1, block):
        ids = torch.as_tensor(tokens[start:start + block].astype(np.int64))[None]
        with torch.no_grad():
            hidden = final_hidden(model, ids)[0]
        distances, _ = store.search(hidden, 1)  # cosine store: distance = 2 - 2 cos
        out.append((1 - distances[:, 0] / 2).numpy())
    return np.concatenate(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--store", required=True)
    ap.add_argument("--tokenized", required=True)
    ap.add_argument("--split", default="val")
    ap.add_argument("--general", required=True)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--block", type=int, default=512)
    args = ap.parse_args()
    torch.set_num_threads(2)
    model = load_causal_lm(args.model)
    store = Datastore.open(args.store)
    if store.similarity != "cosine":
        raise SystemExit("the store was built for knn.similarity l2: no cosines to read")
    data = TokenizedData.open(args.tokenized)
    tokenizer = load_tokenizer(data.tokenizer_dir, data.vocab_size)
    domain = np.asarray(data.tokens(args.split))
    starts = np.linspace(0, len(domain) - args.block, max(args.tokens // args.block, 1)).astype(int)
    domain = domain[starts[:, None] + np.arange(args.block)].reshape(-1)  # windows spread over the split
    with open(args.general, encoding="utf-8") as f:
        general = np.array(tokenizer.encode(f.read(), add_special_tokens=False).ids[:args.tokens])
    print(f"store: {len(store):,} entries; quantiles 10/25/50/75/90% of the nearest key's cosine")
    for name, tokens in ((f"{args.split} split", domain), ("general text", general)):
        cos = nearest_cosines(model, store, tokens, args.block)
        q = np.quantile(cos, [0.1, 0.25, 0.5, 0.75, 0.9])
        print(f"{name}: {len(cos):,} positions: " + " ".join(f"{x:.3f}" for x in q))


if __name__ == "__main__":
    main()
