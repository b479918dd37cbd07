"""Diversity of free generation: prompts spread evenly over the split, each continued by tokens
sampled at temperature 1 (the model's own distribution), against the human text that followed:
unique tokens and share of rare-bucket tokens for both."""

from __future__ import annotations

import numpy as np
import torch

from rarelm.evaluate import prefix
from rarelm.evaluate.common import EvalContext, SplitText
from rarelm.evaluate.decoding import sample_continue
from rarelm.evaluate.token_scoring import BUCKETS, RARE
from rarelm.rare_terms import term_search


def sampled_continuations(ctx: EvalContext, split: SplitText, n_prompts: int, n_new: int,
                          what: str = "sampling continuations") -> tuple[np.ndarray, np.ndarray] | None:
    """(generated, human) int64 [prompts, n_new]: `n_prompts` prompts (up to eval.context_tokens each)
    spread evenly over the split, each continued by `n_new` tokens sampled at temperature 1 (torch
    seeded with the context's seed first), beside the tokens that followed it in the text. None when
    there is nothing to sample (n_prompts 0 or a split too short)."""
    tokens, batch_size = split.tokens, ctx.params.batch_size
    if n_prompts == 0 or len(tokens) < n_new + 2:
        return None
    positions = np.unique(np.linspace(1, len(tokens) - n_new, n_prompts).round().astype(np.int64))
    starts = term_search.document_starts(split.offsets, positions)
    prompts = [term_search.prompt_before(tokens, int(d), int(p), ctx.params.context_tokens, ctx.eot_id)
               for p, d in zip(positions, starts, strict=True)]
    human = np.stack([np.asarray(tokens[p:p + n_new], dtype=np.int64) for p in positions])
    # the model's lead (<bos>), then the train passages BM25 finds for each prompt's text, before it
    prompts = [found + p for p, found in zip(prompts, prefix.prefixes(prompts), strict=True)]
    advance = ctx.advance(what, len(prompts))
    torch.manual_seed(ctx.seed)
    generated = []
    for b in range(0, len(prompts), batch_size):
        generated.append(sample_continue(ctx.model, prompts[b:b + batch_size], n_new, ctx.eot_id,
                                         logit_bias=ctx.logit_bias).numpy())
        advance(len(prompts[b:b + batch_size]))
    return np.concatenate(generated), human


def diversity(ctx: EvalContext, split: SplitText, buckets: np.ndarray) -> dict:
    """Unique tokens and rare-bucket share: eval.diversity_prompts continuations of
    eval.diversity_tokens sampled tokens vs the human text that followed."""
    sampled = sampled_continuations(ctx, split, ctx.params.diversity_prompts, ctx.params.diversity_tokens)
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
