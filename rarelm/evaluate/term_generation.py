"""Rare-term generation: at each chosen term occurrence, does the model write the term?

One row per evaluated occurrence (metrics/eval_occurrences.jsonl); rarelm.evaluate.term_metrics
sums the rows up. The context's `logit_bias` is as in rarelm.evaluate.decoding: None = the model as
trained.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from rarelm.evaluate import prefix
from rarelm.evaluate.common import EvalContext, SplitText
from rarelm.evaluate.decoding import greedy_continue
from rarelm.evaluate.scoring import candidates_nll, continuation_scores, tree_candidates_nll
from rarelm.rare_terms import term_search


@dataclasses.dataclass(frozen=True)
class Prompted:
    """One chosen occurrence, ready to decode: its prompt, the document's tokens covering the term,
    and the text due (lead + the term as written there)."""

    occurrence: term_search.Occurrence
    prompt: list[int]
    cover: list[int]
    expected: str


def _generate_text(ctx: EvalContext, prompts: list[list[int]], targets: list[str], n_first: list[int],
                   heads: list[list[int]] | None = None) -> list[list[int]]:
    """Greedy tokens for each prompt, until the decoded text covers its target or cannot match it.

    Every row first gets n_first + 1 tokens; a row whose text is still a strict
    prefix of its target, in any case (the model wrote the term in more, smaller
    tokens than the document has), continues, up to 2 * n_first + 4 tokens in all.
    `heads`: tokens given after each prompt as if the model had written them (the term's
    first token, for the completion match); they count among the row's tokens and lead it.
    """
    model, eot_id, logit_bias = ctx.model, ctx.eot_id, ctx.logit_bias
    heads = heads or [[] for _ in prompts]
    width = max(n + 1 - len(h) for n, h in zip(n_first, heads, strict=True))
    led = [p + h for p, h in zip(prompts, heads, strict=True)]
    first = greedy_continue(model, led, max(width, 1), eot_id, logit_bias, own=list(map(len, heads)))
    generated = [list(map(int, row)) for row in first.numpy()]
    generated = [h + g[:n + 1 - len(h)] for g, h, n in zip(generated, heads, n_first, strict=True)]
    for _ in range(4):
        open_rows = []
        for i, (g, target) in enumerate(zip(generated, targets, strict=True)):
            # casefolded, so a row that writes the term in another case goes on (exact_match_ci)
            text = ctx.tokenizer.decode(g, skip_special_tokens=False).rstrip("\ufffd").casefold()
            target = target.casefold()
            if len(text) < len(target) and target.startswith(text) and len(g) < 2 * n_first[i] + 4:
                open_rows.append(i)
        if not open_rows:
            break
        more = greedy_continue(model, [prompts[i] + generated[i] for i in open_rows],
                               max(n_first[i] for i in open_rows) + 1, eot_id, logit_bias,
                               own=[len(generated[i]) for i in open_rows]).numpy()
        for row, i in enumerate(open_rows):
            generated[i] += list(map(int, more[row]))[:2 * n_first[i] + 4 - len(generated[i])]
    return generated


def evaluate_terms(ctx: EvalContext, split: SplitText, terms: list[term_search.Term],
                   per_term: list[list[term_search.Occurrence]] | None = None) -> list[dict]:
    """One row per evaluated term occurrence (metrics/eval_occurrences.jsonl); `term_metrics` sums them up.

    At each chosen occurrence (`per_term`, else term_search.find_occurrences in the split's documents;
    capped at eval.max_terms round robin over terms, or over occurrences with eval.term_sample
    "occurrences"):
    the prompt is up to eval.context_tokens of the document's tokens before the first
    token covering the term; the model writes greedily until its decoded text
    covers `lead + surface` (lead: the text of that first token before the term, " "
    in English; surface: the term as written at that occurrence, "PKI" or "pki");
    `exact_match` = the text starts with lead + surface, `exact_match_ci` = the same
    compared case folded (" Pki" matches " PKI" there). `first_token_hit`
    = the first greedy token is the document's first covering token. Teacher-forced
    on the document's covering tokens after the prompt (`continuous_figures`): `nll`
    (mean per token), `nll_sum` (nats per term), `nll_per_char` (per character of the
    covered text, so tokenizers compare), `token_acc` (share of covering tokens that
    are the top-1 prediction), `first_token_rank` and `first_token_rr` (its reciprocal).
    With eval.closed_set, each extracted term (tokenized as lead + term) is scored after
    the same prompt by summed NLL, and `choice_rank` is 1 + the number of terms the
    model prefers to the true one (1 = the model would pick the right term from the
    list); the true term is the one as written at the occurrence, the others their
    display forms.

    eval.batch_size occurrences are decoded and teacher-forced per forward, and the closed
    set scores every open prefix of one length per forward (scoring.tree_candidates_nll);
    eval.batch_size 1 is the per-occurrence path (one prompt per decode, one row per open
    prefix: scoring.candidates_nll), with the same rows up to float32 rounding of the NLLs.
    """
    params, tokens, offsets = ctx.params, split.tokens, split.offsets
    if per_term is None:
        per_term = term_search.find_occurrences(ctx.tokenizer, split.documents, tokens, offsets, terms)
    tasks = [_prompted(o, tokens, offsets, terms, params.context_tokens, ctx.eot_id)
             for o in term_search.select(per_term, params.max_terms, params.term_sample)]
    # the model's lead (<bos>), then the train passages BM25 finds for the text before each term
    tasks = [dataclasses.replace(t, prompt=found + t.prompt)
             for t, found in zip(tasks, prefix.prefixes([t.prompt for t in tasks]), strict=True)]
    batch_size, n_choices = params.batch_size, len(terms) if params.closed_set else None
    ranker = ClosedSet(ctx.model, ctx.tokenizer, terms, ctx.logit_bias, tree=batch_size > 1) \
        if params.closed_set else None
    rows: list[dict] = [{} for _ in tasks]
    order = sorted(range(len(tasks)), key=lambda i: (len(tasks[i].cover), len(tasks[i].prompt)))
    advance = ctx.advance("generating terms", len(tasks))
    for b in range(0, len(order), batch_size):
        batch = [tasks[i] for i in order[b:b + batch_size]]
        generated = _generate_text(ctx, [t.prompt for t in batch], [t.expected for t in batch],
                                   [len(t.cover) for t in batch])
        completed = _complete(ctx, batch, generated)
        scored = continuation_scores(ctx.model, [t.prompt for t in batch], [t.cover for t in batch],
                                     ctx.eot_id, ctx.logit_bias)
        for i, task, output, done, (nll, rank) in zip(order[b:b + batch_size], batch, generated, completed,
                                                      scored, strict=True):
            choice = None if ranker is None else ranker.rank(task, float(nll.sum()))
            rows[i] = _row(ctx.tokenizer, split.name, task, terms[task.occurrence.term], (output, done),
                           (nll, rank, choice, n_choices))
        advance(len(batch))
    return rows


def _complete(ctx: EvalContext, batch: list[Prompted], generated: list[list[int]]) -> list[list[int]]:
    """What the model writes when the term's first covering token is given after the prompt: that
    token, then greedy tokens as `_generate_text` writes them.

    Greedy decoding is deterministic, so where the model's own first token already is the term's
    (first_token_hit), the completion is what it wrote: only the other rows are decoded again.
    """
    out = list(generated)
    redo = [i for i, (t, g) in enumerate(zip(batch, generated, strict=True))
            if g[0] != t.cover[0] and len(t.cover) > 1]
    if redo:
        again = _generate_text(ctx, [batch[i].prompt for i in redo], [batch[i].expected for i in redo],
                               [len(batch[i].cover) for i in redo], heads=[batch[i].cover[:1] for i in redo])
        for i, g in zip(redo, again, strict=True):
            out[i] = g
    for i, t in enumerate(batch):
        if len(t.cover) == 1 and out[i][0] != t.cover[0]:
            out[i] = t.cover[:1]  # a one-token term: the given token is the whole term
    return out


def _prompted(o: term_search.Occurrence, tokens: np.ndarray, offsets: np.ndarray,
              terms: list[term_search.Term], context_tokens: int, eot_id: int) -> Prompted:
    """The occurrence's prompt (up to `context_tokens` before its first covering token), covering
    tokens and expected text."""
    prompt = term_search.prompt_before(tokens, int(offsets[o.doc]), o.start, context_tokens, eot_id)
    return Prompted(o, prompt, [int(t) for t in tokens[o.start:o.end]],
                    o.lead + (o.surface or terms[o.term].text))


class ClosedSet:
    """Where the true term ranks among all extracted terms after an occurrence's prompt (summed NLL).

    Each extracted term is tokenized as lead + term (once per lead) and scored with
    candidates_nll; the true term is the one as written at the occurrence, the others
    their display forms. Rank 1 = the model would pick the right term from the list;
    a term with the true term's tokens ties with it (not counted).
    `tree`: score with scoring.tree_candidates_nll (a level of the trie per forward), else
    with scoring.candidates_nll (a row per open prefix).
    """

    def __init__(self, model, tokenizer, terms: list[term_search.Term], logit_bias=None, tree: bool = True):
        self.model, self.tokenizer, self.terms, self.logit_bias = model, tokenizer, terms, logit_bias
        self.score = tree_candidates_nll if tree else candidates_nll
        self.candidate_ids: dict[str, list[list[int]]] = {}  # lead -> every term tokenized after it

    def rank(self, task: Prompted, cover_nll: float) -> int:
        """1 + the number of terms the model prefers to the true one; `cover_nll`: the summed NLL of
        the document's covering tokens (the true term's, when it tokenizes to them)."""
        o, lead = task.occurrence, task.occurrence.lead
        if lead not in self.candidate_ids:
            self.candidate_ids[lead] = [e.ids for e in self.tokenizer.encode_batch(
                [lead + t.text for t in self.terms], add_special_tokens=False)]
        ids = self.candidate_ids[lead][o.term] if task.expected == lead + self.terms[o.term].text else \
            self.tokenizer.encode(task.expected, add_special_tokens=False).ids  # the true term as written
        true_nll = cover_nll if ids == task.cover else \
            self.score(self.model, task.prompt, [ids], logit_bias=self.logit_bias)[0]
        candidates = self.candidate_ids[lead]
        scores = self.score(self.model, task.prompt, candidates, bound=true_nll, logit_bias=self.logit_bias)
        # only the others are counted against it; a term written with the same tokens ("The cat" for
        # "the cat" written "The cat") ties with it, whatever the last bits of two computations say
        scores[[i for i, c in enumerate(candidates) if i == o.term or c == ids]] = true_nll
        return 1 + int((scores < true_nll).sum())


def _row(tokenizer, split: str, task: Prompted, term: term_search.Term, written: tuple[list[int], list[int]],
         scores: tuple[np.ndarray, np.ndarray, int | None, int | None]) -> dict:
    """One occurrence's row of metrics/eval_occurrences.jsonl (its keys in this order).

    `written`: the tokens the model wrote after the prompt, and after the prompt plus the term's
    first covering token (`completed`, which starts with that token); `completion_match`: the
    latter starts with lead + term, the model spells the rest of the term once it has begun it.
    `scores`: the covering tokens' teacher-forced NLL and rank, the closed-set rank and of how many
    terms (None, None without the closed set)."""
    (generated, completed), (nll, rank, choice_rank, n_choices) = written, scores
    o, expected = task.occurrence, task.expected
    text = tokenizer.decode(generated, skip_special_tokens=False)
    completion = tokenizer.decode(completed, skip_special_tokens=False)
    covered = tokenizer.decode(task.cover, skip_special_tokens=False)
    return {"split": split, "term": term.text, "train_count": term.count,
            "band": term_search.band_label(term.count), "mention": o.mention, "doc": o.doc,
            "char_start": o.char_start, "prompt_tokens": len(task.prompt),
            "expected": expected, "output": text,
            "exact_match": text.startswith(expected),
            "exact_match_ci": text.casefold().startswith(expected.casefold()),
            "prefix_share": prefix_share(text, expected, len(o.lead)),
            "first_token_hit": bool(generated[0] == task.cover[0]),
            "completion_match": completion.startswith(expected),
            "nll": float(nll.mean()),
            **continuous_figures(nll, rank, covered),
            "choice_rank": choice_rank, "n_choices": n_choices}


def prefix_share(text: str, expected: str, lead: int) -> float:
    """The share of the term's characters (`expected` after its first `lead` characters) that `text`
    writes right before its first wrong one: 1.0 = exact match, a graded figure with an event at
    every character where exact match has one per term.

    >>> prefix_share(" public key infra", " public key infrastructure", 1), prefix_share(" pub", " PKI", 1)
    (0.64, 0.0)
    >>> prefix_share("套接口", "套接字", 0)
    0.6666666666666666
    """
    same = len(os.path.commonprefix([text, expected]))
    return max(same - lead, 0) / max(len(expected) - lead, 1)


def continuous_figures(nll: np.ndarray, rank: np.ndarray, covered_text: str) -> dict:
    """One occurrence's continuous figures from its covering tokens' NLL and rank (teacher forced).

    >>> f = continuous_figures(np.array([0.5, 1.5]), np.array([3, 1]), " acute MI")
    >>> f["nll_sum"], f["n_chars"], round(f["nll_per_char"], 4), f["token_acc"], f["first_token_rr"]
    (2.0, 9, 0.2222, 0.5, 0.3333333333333333)
    """
    n_chars = max(len(covered_text), 1)
    total = float(nll.sum())
    return {"n_tokens": len(nll), "n_chars": n_chars, "nll_sum": total, "nll_per_char": total / n_chars,
            "token_acc": float((rank == 1).mean()), "first_token_rank": int(rank[0]),
            "first_token_rr": 1.0 / int(rank[0])}
