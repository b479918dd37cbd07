"""Every measurement on one split of the data (`evaluate_split`), and metrics/eval.json from all
the splits of `eval.splits` (`combine`)."""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np

from rarelm.errors import RarelmError
from rarelm.evaluate import prefix
from rarelm.evaluate.common import Progress
from rarelm.evaluate.decoding import constrained, context_length, logit_adjustment
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


def evaluate_split(model, tokenizer, data, documents: list[str], split: str, buckets: np.ndarray,
                   terms: list[term_search.Term], params: EvalParams, seed: int,
                   progress: Progress | None = None, log_prior: np.ndarray | None = None) -> SplitResult:
    """All four measurements on one split of a TokenizedData; `documents` is its prepared text.

    `log_prior` (rare.log_prior of the train counts) is needed when eval.logit_adjust_tau > 0.
    """
    tokens, offsets = data.tokens(split), data.offsets(split)
    if len(tokens) and int(tokens.max()) >= len(buckets):
        raise RarelmError(f"{split} split holds token id {int(tokens.max())}, outside the vocabulary of "
                          f"{len(buckets)}; re-run the tokenize and rare_terms stages")
    limit = context_length(model)
    block = prefix.window(params.block_size, limit)  # fits the context with the lead, or a RarelmError
    steps, seconds = Steps(f"evaluate: {split}"), {}  # a line per measurement once the split took 10 s

    def lap(name: str) -> None:
        seconds[name] = round(steps.done(name), 2)

    per_term = term_search.find_occurrences(tokenizer, documents, tokens, offsets, terms)
    lap("finding terms")
    context = _prompt_tokens(params, limit, per_term)
    if params.logit_adjust_tau and log_prior is None:
        raise ValueError("eval.logit_adjust_tau > 0 needs the train log prior")
    bias = logit_adjustment(model, log_prior, params.logit_adjust_tau)
    stats = score_tokens(model, tokens, buckets, block, params.batch_size, progress,
                         term_search.term_token_mask(per_term, len(tokens)), logit_bias=bias,
                         start_mask=term_start_mask(per_term, len(tokens)), max_tokens=params.max_tokens)
    lap("scoring tokens")
    trie = term_trie(tokenizer, terms, usual_lead(per_term)) if params.term_trie else None
    with constrained(trie) if trie else contextlib.nullcontext():  # what generates; the scores are above
        rows = evaluate_terms(model, tokenizer, documents, tokens, offsets, terms, max_terms=params.max_terms,
                              sample=params.term_sample,
                              context_tokens=context, batch_size=params.batch_size, eot_id=data.eot_id,
                              closed_set=params.closed_set, split=split, per_term=per_term,
                              progress=progress, logit_bias=bias)
        lap("term generation")
        div = diversity(model, tokens, offsets, buckets, n_prompts=params.diversity_prompts,
                        n_new=params.diversity_tokens, context_tokens=context, batch_size=params.batch_size,
                        eot_id=data.eot_id, seed=seed, progress=progress, logit_bias=bias)
        lap("diversity")
        found = sum(map(len, per_term))
        inserted = false_insertion(model, tokenizer, tokens, offsets, terms, found,
                                   n_prompts=params.insertion_prompts, n_new=params.insertion_tokens,
                                   context_tokens=context, batch_size=params.batch_size, eot_id=data.eot_id,
                                   seed=seed, progress=progress, logit_bias=bias,
                                   text_chars=sum(map(len, documents)))
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
