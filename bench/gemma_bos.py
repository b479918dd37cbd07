"""A scored window that starts cold, against one led by the start-of-sequence token or by other text:
the perplexity of the same val windows under a model, three ways.

    .venv/bin/python -P bench/gemma_bos.py --model gemma3/model --tokenized <tokenize folder>/out

evaluate scores windows of the tokenized split as they are (no start-of-sequence token: the
tokenize stage writes documents and end-of-text tokens only). Gemma 3 was trained with <bos> first
in every sequence; this prints what a window loses without it (overall, over its first 8 targets,
over the rest), and what 129 train tokens in front give instead (the width of retrieval.* with 2
passages of 64). Four windows of 256 targets, spread over the split.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from rarelm.artifacts.tokenized import TokenizedData
from rarelm.evaluate.model_folder import load_causal_lm


def target_nll(model, prefix: list[int], window: list[int]) -> torch.Tensor:
    """NLL of each target of `window` (all its tokens after the first) with `prefix` before it."""
    ids = torch.tensor([prefix + window])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), -1)
    k = len(prefix)
    return -logp[k:-1].gather(-1, ids[0, k + 1:, None]).squeeze(-1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenized", required=True)
    ap.add_argument("--split", default="val")
    args = ap.parse_args()
    torch.set_num_threads(2)
    data = TokenizedData.open(args.tokenized)
    tokens = np.asarray(data.tokens(args.split))
    model = load_causal_lm(args.model)
    other = [int(t) for t in np.asarray(data.tokens("train"))[5000:5129]]
    starts = np.linspace(1000, len(tokens) - 600, 4).astype(int)
    for name, prefix in (("cold", []), ("<bos> first", [model.config.bos_token_id]),
                         ("129 train tokens first", other)):
        nll = torch.stack([target_nll(model, prefix, [int(t) for t in tokens[s:s + 257]]) for s in starts])
        print(f"{name:24s} ppl {nll.mean().exp():.1f}; first 8 targets {nll[:, :8].mean().exp():.1f}; "
              f"the rest {nll[:, 8:].mean().exp():.1f}")


if __name__ == "__main__":
    main()
