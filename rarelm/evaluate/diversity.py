"""Diversity of free generation: prompts spread evenly over the split, each continued by tokens
sampled at temperature 1 (the model's own distribution), against the human text that followed:
unique tokens and share of rare-bucket tokens for both."""

from __future__ import annotations

import numpy as np
import torch

from rarelm.evaluate import prefix
from rarelm.evaluate.common import Progress, silent
from rarelm.evaluate.decoding import sample_continue
from rarelm.evaluate.token_scoring import BUCKETS, RARE
from rarelm.rare_terms import term_search


def sampled_continuations(model, tokens: np.ndarray, offsets: np.ndarray, *, n_prompts: int, n_new: int,
                          context_tokens: int, batch_size: int, eot_id: int, seed: int,
                          progress: Progress | None = None, logit_bias=None,
                          what: str = "sampling continuations") -> tuple[np.ndarray, np.ndarray] | None:
    """(generated, human) int64 [prompts, n_new]: `n_prompts` prompts spread evenly over the split,
    each continued by `n_new` tokens sampled at temperature 1, beside the tokens that followed it
    in the text. None when there is nothing to sample (n_prompts 0 or a split too short)."""
    if n_prompts == 0 or len(tokens) < n_new + 2:
        return None
    positions = np.unique(np.linspace(1, len(tokens) - n_new, n_prompts).round().astype(np.int64))
    starts = term_search.document_starts(offsets, positions)
    prompts = [term_search.prompt_before(tokens, int(d), int(p), context_tokens, eot_id)
               for p, d in zip(positions, starts, strict=True)]
    human = np.stack([np.asarray(tokens[p:p + n_new], dtype=np.int64) for p in positions])
    # the model's lead (<bos>), then the train passages BM25 finds for each prompt's text, before it
    prompts = [found + p for p, found in zip(prompts, prefix.prefixes(prompts), strict=True)]
    advance = (progress or silent)(what, len(prompts))
    torch.manual_seed(seed)
    generated = []
    for b in range(0, len(prompts), batch_size):
        generated.append(sample_continue(model, prompts[b:b + batch_size], n_new, eot_id,
                                         logit_bias=logit_bias).numpy())
        advance(len(prompts[b:b + batch_size]))
    return np.concatenate(generated), human


def diversity(model, tokens: np.ndarray, offsets: np.ndarray, buckets: np.ndarray, *, n_prompts: int,
              n_new: int, context_tokens: int, batch_size: int, eot_id: int, seed: int,
              progress: Progress | None = None, logit_bias=None) -> dict:
    """Unique tokens and rare-bucket share: sampled continuations vs the human text that followed."""
    sampled = sampled_continuations(model, tokens, offsets, n_prompts=n_prompts, n_new=n_new,
                                    context_tokens=context_tokens, batch_size=batch_size, eot_id=eot_id,
                                    seed=seed, progress=progress, logit_bias=logit_bias)
    if sampled is None:
        return {"n_gen_tokens": 0}
    gen, human = sampled

    def bucket_of(ids: np.ndarray) -> np.ndarray:  # ids past the tokenizer's vocabulary count as unseen
        safe = np.minimum(ids, len(buckets) - 1)
        return np.where(ids < len(buckets), buckets[safe], BUCKETS.index("unseen"))

    return {"gen_unique_tokens": int(len(np.unique(gen))), "human_unique_tokens": int(len(np.unique(human))),
            "gen_rare_share": float((bucket_of(gen) == RARE).mean()),
            "human_rare_share": float((bucket_of(human) == RARE).mean()),
            "n_gen_tokens": int(gen.size)}
