"""Every measurement on one split of the data (`evaluate_split`), and metrics/eval.json from all
the splits of `eval.splits` (`combine`)."""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np

from rarelm.errors import RarelmError
from rarelm.evaluate import prefix
from rarelm.evaluate.common import EvalContext, SplitText
from rarelm.evaluate.decoding import constrained, context_length
from rarelm.evaluate.diversity import diversity
from rarelm.evaluate.false_insertion import false_insertion, term_start_mask
from rarelm.evaluate.term_generation import evaluate_terms
from rarelm.evaluate.term_metrics import band_rows, term_metrics
from rarelm.evaluate.term_trie import term_trie, usual_lead
from rarelm.evaluate.token_scoring import score_tokens
from rarelm.params import EvalParams
from rarelm.progress import Steps
from rarelm.rare_terms import term_search


@dataclasses.dataclass
class SplitResult:
    metrics: dict
    bucket_rows: list[dict]
    band_rows: list[dict]
    occurrences: list[dict]  # one row per evaluated term occurrence (evaluate_terms)
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)  # per measurement, for the log


def evaluate_split(ctx: EvalContext, split: SplitText, buckets: np.ndarray,
                   terms: list[term_search.Term]) -> SplitResult:
    """All four measurements on one split (its documents' text too).

    `ctx.logit_bias` (decoding.logit_adjustment of rare.log_prior of the train counts) is needed
    when eval.logit_adjust_tau > 0.
    """
    params, tokens = ctx.params, split.tokens
    if len(tokens) and int(tokens.max()) >= len(buckets):
        raise RarelmError(f"{split.name} split holds token id {int(tokens.max())}, outside the vocabulary of "
                          f"{len(buckets)}; re-run the tokenize and rare_terms stages")
    limit = context_length(ctx.model)
    block = prefix.window(params.block_size, limit)  # fits the context with the lead, or a RarelmError
    steps, seconds = Steps(f"evaluate: {split.name}"), {}  # a line per measurement once the split took 10 s

    def lap(name: str) -> None:
        seconds[name] = round(steps.done(name), 2)

    per_term = term_search.find_occurrences(ctx.tokenizer, split.documents, tokens, split.offsets, terms)
    lap("finding terms")
    # prompts of term generation, diversity and false insertion: eval.context_tokens cut to fit
    ctx = dataclasses.replace(ctx, params=dataclasses.replace(
        params, context_tokens=_prompt_tokens(params, limit, per_term)))
    if params.logit_adjust_tau and ctx.logit_bias is None:
        raise ValueError("eval.logit_adjust_tau > 0 needs the logit bias of the train log prior")
    stats = score_tokens(ctx, tokens, buckets, block, term_search.term_token_mask(per_term, len(tokens)),
                         term_start_mask(per_term, len(tokens)))
    lap("scoring tokens")
    trie = term_trie(ctx.tokenizer, terms, usual_lead(per_term), params.term_trie_min_mass) \
        if params.term_trie else None
    with constrained(trie) if trie else contextlib.nullcontext():  # what generates; the scores are above
        rows = evaluate_terms(ctx, split, terms, per_term)
        lap("term generation")
        div = diversity(ctx, split, buckets)
        lap("diversity")
        found = sum(map(len, per_term))
        inserted = false_insertion(ctx, split, terms, found)
        lap("false insertion")
    repeats = sum(o.mention == "repeat" for occurrences in per_term for o in occurrences)
    metrics = {**stats.metrics(), **term_metrics(rows, len(terms), found), **div, **inserted,
               "term_repeat_share_text": repeats / found if found else None}  # every occurrence, uncapped
    return SplitResult(metrics, stats.rows(), band_rows(rows), rows, seconds)


def _prompt_tokens(params: EvalParams, limit: int | None,
                   per_term: list[list[term_search.Occurrence]]) -> int:
    """eval.context_tokens, cut so that a prompt and what the model writes after it fit in the model's
    context of `limit` tokens: the longest term twice over plus 4, or a diversity / insertion sample.

    A context of 128, terms of at most 3 tokens and 64-token samples leave prompts of 64 tokens.
    """
    longest = max((o.end - o.start for occ in per_term for o in occ), default=1)
    context = params.context_tokens
    if limit:
        generated = max(2 * longest + 4, params.diversity_tokens if params.diversity_prompts else 0,
                        params.insertion_tokens if params.insertion_prompts else 0)
        context = min(context, limit - generated - prefix.width())
        if context < 1:
            raise RarelmError(f"the model's context of {limit} tokens is too short for terms of "
                              f"{longest} tokens, eval.diversity_tokens = {params.diversity_tokens}, "
                              f"eval.insertion_tokens = {params.insertion_tokens} and "
                              f"{prefix.width()} tokens of lead and retrieved passages")
    return context


def combine(results: dict[str, SplitResult]) -> dict:
    """metrics/eval.json: the first split's metrics at the top level, the others under their name."""
    splits = list(results)
    out = dict(results[splits[0]].metrics)
    for split in splits[1:]:
        out[split] = dict(results[split].metrics)
    return out
