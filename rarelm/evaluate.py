"""The `evaluate` stage's measurements: how well a model predicts and writes rare tokens and terms.

For each split in `eval.splits`, four measurements, each with the counts behind it:

1. Teacher-forced scoring (`score_tokens`): the split is cut into consecutive,
   non-overlapping windows of `block_size` targets (every token but the first is
   a target exactly once); one forward pass per batch gives each target's NLL,
   whether it was the top-1 prediction and whether it was in the top 5. Summed
   per frequency bucket of the target (data/rare/buckets.npy: frequent, medium,
   rare, unseen-in-train), that yields `ppl`, `ppl_<bucket>`, `acc_<bucket>`,
   `recall_at_5_<bucket>`, `rare_token_acc`, `rare_token_recall_at_5`.
2. Rare-term generation (`evaluate_terms`): every occurrence of a term of
   data/rare/terms.jsonl in the split's text (term_search.find_occurrences;
   capped at `eval.max_terms`, round robin over terms); prompt = up to
   `eval.context_tokens` tokens before the first token covering the term; greedy
   decoding until the text covers lead + term as written there. One row per
   occurrence (exact match, also case folded, first-token hit, closed-set rank
   among all terms, mention type, band, and teacher-forced on the term's covering
   tokens: NLL per token, per term and per character, term-token accuracy,
   first-token rank); `term_metrics` turns the rows into `term_exact_match`,
   `term_exact_match_ci`, `term_first_token_acc`, `term_nll`, `term_nll_per_term`,
   `term_nll_per_char`, `term_token_acc`, `term_first_token_mrr`,
   `term_choice_acc`, their `_first` / `_repeat` / `_le15` / `_band_<lo-hi>` /
   `_macro` variants and `em50_train_count`. The tokens covering term occurrences
   are also scored as their own class in (1): `ppl_term`, `acc_term`,
   `recall_at_5_term`; and the model's probability mass on term-start tokens
   where no term starts (`false_insertion_start_mass`).
3. Diversity (`diversity`): `eval.diversity_prompts` prompts spread evenly over
   the split, each continued by `eval.diversity_tokens` tokens sampled at
   temperature 1 (the model's own distribution), against the human text that
   followed: unique tokens and share of rare-bucket tokens for both.
4. False insertion (`false_insertion`): `eval.insertion_prompts` sampled
   continuations of `eval.insertion_tokens` tokens; extracted terms per 1,000
   tokens in them vs in the split's text (`false_insertion_rate`).

With `eval.logit_adjust_tau` > 0 all four measure the post-hoc logit-adjusted
model, `logits - tau * log pi` (pi: the train unigram prior, rare.log_prior), the
model a user would deploy: its scores, greedy terms, closed-set ranks and samples
(`logit_bias`, rarelm.lm.logit_adjustment; None = the model as trained).

A worked example with a model whose predictions are known: if the targets are
[a, b] with probabilities 0.5 and 0.25 under the model, ppl = exp((ln 2 + ln 4) / 2)
= sqrt(8) ~ 2.83; if a is frequent and b rare, ppl_frequent = 2, ppl_rare = 4.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from rarelm import term_search
from rarelm.errors import RarelmError
from rarelm.params import EvalParams

BUCKETS = ("frequent", "medium", "rare", "unseen")
CLASSES = (*BUCKETS, "term")  # "term": tokens covering a term occurrence (also in their bucket)
RARE, TERM = BUCKETS.index("rare"), CLASSES.index("term")

# progress("what", total) -> advance(n); None = silent
Progress = Callable[[str, int], Callable[[int], None]]


def _silent(description: str, total: int) -> Callable[[int], None]:
    return lambda n: None


def _ratio(num: float, den: float) -> float | None:
    return None if den == 0 else num / den


def _ppl(nll_sum: float, n: int) -> float | None:
    return None if n == 0 else math.exp(nll_sum / n)


# ---------------------------------------------------------------- teacher-forced scoring


@dataclasses.dataclass
class TokenStats:
    """Per-class sums over scored targets: index = bucket id, and TERM for tokens covering a term.

    Term tokens are also counted in their frequency bucket; the overall figures sum the buckets.
    """

    tokens: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(len(CLASSES), np.int64))
    nll: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(len(CLASSES), np.float64))
    top1: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(len(CLASSES), np.int64))
    top5: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(len(CLASSES), np.int64))
    # term-start tokens (false insertion, b); index 0: targets where no term starts, 1: where one does
    start_positions: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(2, np.int64))
    start_mass: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(2, np.float64))
    start_hits: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(2, np.int64))
    n_start_ids: int = 0

    def add_starts(self, at_start: np.ndarray, mass: np.ndarray, hit: np.ndarray) -> None:
        """Per target: whether a term starts there, the model's mass on term-start tokens, whether
        the target is one."""
        index = at_start.astype(np.int64)
        self.start_positions += np.bincount(index, minlength=2)
        self.start_mass += np.bincount(index, weights=mass, minlength=2)
        self.start_hits += np.bincount(index, weights=hit, minlength=2).astype(np.int64)

    def add(self, cls: np.ndarray, nll: np.ndarray, top1: np.ndarray, top5: np.ndarray) -> None:
        size = len(CLASSES)
        self.tokens += np.bincount(cls, minlength=size)
        self.nll += np.bincount(cls, weights=nll, minlength=size)
        self.top1 += np.bincount(cls, weights=top1, minlength=size).astype(np.int64)
        self.top5 += np.bincount(cls, weights=top5, minlength=size).astype(np.int64)

    def metrics(self) -> dict:
        b = len(BUCKETS)
        n = int(self.tokens[:b].sum())
        out = {"ppl": _ppl(float(self.nll[:b].sum()), n), "token_acc": _ratio(int(self.top1[:b].sum()), n),
               "token_recall_at_5": _ratio(int(self.top5[:b].sum()), n), "n_eval_tokens": n}
        for c, name in enumerate(CLASSES):
            k = int(self.tokens[c])
            out[f"ppl_{name}"] = _ppl(float(self.nll[c]), k)
            out[f"acc_{name}"] = _ratio(int(self.top1[c]), k)
            out[f"recall_at_5_{name}"] = _ratio(int(self.top5[c]), k)
            out[f"n_tokens_{name}"] = k
        out["rare_token_acc"] = out["acc_rare"]
        out["rare_token_recall_at_5"] = out["recall_at_5_rare"]
        if self.n_start_ids:
            out.update(self.start_metrics())
        return out

    def start_metrics(self) -> dict:
        """False insertion (b): probability mass on term-start tokens where no term starts.

        `false_insertion_start_mass`: mean over targets where no term occurrence starts of
        P(next token is a term-start token); `false_insertion_start_freq`: how often the
        text itself has a term-start token there (a calibrated model's mass equals it);
        `term_start_mass`: the same mass where a term does start. With mass 0.25 and 0.05 at
        two non-start targets whose tokens are not term starts: mass 0.15, freq 0.
        """
        n, hits, mass = self.start_positions, self.start_hits, self.start_mass
        return {"false_insertion_start_mass": _ratio(float(mass[0]), int(n[0])),
                "false_insertion_start_freq": _ratio(int(hits[0]), int(n[0])),
                "term_start_mass": _ratio(float(mass[1]), int(n[1])),
                "n_term_start_ids": self.n_start_ids}

    def rows(self) -> list[dict]:
        """Plot rows: one for all tokens, one per non-empty bucket, and term tokens."""
        m = self.metrics()
        rows = [{"bucket": "all", "tokens": m["n_eval_tokens"], "ppl": m["ppl"], "acc": m["token_acc"],
                 "recall_at_5": m["token_recall_at_5"]}]
        for name in CLASSES:
            if m[f"n_tokens_{name}"]:
                rows.append({"bucket": name, "tokens": m[f"n_tokens_{name}"], "ppl": m[f"ppl_{name}"],
                             "acc": m[f"acc_{name}"], "recall_at_5": m[f"recall_at_5_{name}"]})
        return rows


def _score_batch(model, windows: np.ndarray, buckets: np.ndarray, is_term: np.ndarray,
                 stats: TokenStats, logit_bias=None, at_start: np.ndarray | None = None,
                 start_ids=None) -> None:
    import torch

    ids = torch.as_tensor(windows.astype(np.int64), device=model.device)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    with torch.no_grad():
        logits = model(input_ids=inputs).logits.float()
    if logit_bias is not None:
        logits = logits + logit_bias
    target_logit = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    log_norm = torch.logsumexp(logits, dim=-1)
    nll = log_norm - target_logit
    if start_ids is not None:
        mass = torch.exp(torch.logsumexp(logits[..., start_ids], dim=-1) - log_norm)
        hit = torch.isin(targets, start_ids)
        stats.add_starts(at_start.reshape(-1), mass.reshape(-1).double().cpu().numpy(),
                         hit.reshape(-1).cpu().numpy())
    top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices  # sorted: top[..., 0] is the argmax
    hit1 = top[..., 0] == targets
    hit5 = (top == targets.unsqueeze(-1)).any(-1)
    flat = targets.reshape(-1).cpu().numpy()
    nll, hit1, hit5 = (x.reshape(-1).cpu().numpy() for x in (nll.double(), hit1, hit5))
    stats.add(buckets[flat], nll, hit1, hit5)
    term = is_term.reshape(-1)
    if term.any():
        stats.add(np.full(int(term.sum()), TERM), nll[term], hit1[term], hit5[term])


def score_tokens(model, tokens: np.ndarray, buckets: np.ndarray, block_size: int, batch_size: int,
                 progress: Progress | None = None, term_mask: np.ndarray | None = None,
                 logit_bias=None, start_mask: np.ndarray | None = None) -> TokenStats:
    """Teacher-forced NLL / top-1 / top-5 of every token after the first, summed per class.

    `term_mask` (bool per split position) marks the tokens that cover a term occurrence;
    `start_mask` the first covering token of each occurrence: the tokens found there are the
    term-start tokens whose probability mass TokenStats.start_metrics reports.
    """
    import torch

    stats = TokenStats()
    n = len(tokens)
    if term_mask is None:
        term_mask = np.zeros(n, dtype=bool)
    start_ids = None
    if start_mask is not None and start_mask.any():
        ids = np.unique(np.asarray(tokens)[start_mask]).astype(np.int64)
        stats.n_start_ids = len(ids)
        start_ids = torch.as_tensor(ids, device=model.device)
    starts = np.arange(0, max(n - 1, 0), block_size)
    advance = (progress or _silent)("scoring tokens", max(n - 1, 0))
    for b in range(0, len(starts), batch_size):
        batch = starts[b:b + batch_size]
        targets = np.minimum(block_size, n - 1 - batch)  # only the split's last window is shorter
        for length in np.unique(targets):
            first = batch[targets == length]
            rows = [tokens[s:s + length + 1] for s in first]
            terms = np.stack([term_mask[s + 1:s + length + 1] for s in first])
            at_start = None if start_ids is None else \
                np.stack([start_mask[s + 1:s + length + 1] for s in first])
            _score_batch(model, np.stack(rows), buckets, terms, stats, logit_bias, at_start, start_ids)
        advance(int(targets.sum()))
    return stats


# ---------------------------------------------------------------- rare-term generation


def _generate_text(model, tokenizer, prompts: list[list[int]], targets: list[str], n_first: list[int],
                   eot_id: int, logit_bias=None) -> list[list[int]]:
    """Greedy tokens for each prompt, until the decoded text covers its target or cannot match it.

    Every row first gets n_first + 1 tokens; a row whose text is still a strict
    prefix of its target, in any case (the model wrote the term in more, smaller
    tokens than the document has), continues, up to 2 * n_first + 4 tokens in all.
    """
    from rarelm.lm import greedy_continue

    generated = [list(map(int, row)) for row in
                 greedy_continue(model, prompts, max(n_first) + 1, eot_id, logit_bias).numpy()]
    generated = [g[:n + 1] for g, n in zip(generated, n_first, strict=True)]
    for _ in range(4):
        open_rows = []
        for i, (g, target) in enumerate(zip(generated, targets, strict=True)):
            # casefolded, so a row that writes the term in another case goes on (exact_match_ci)
            text = tokenizer.decode(g, skip_special_tokens=False).rstrip("\ufffd").casefold()
            target = target.casefold()
            if len(text) < len(target) and target.startswith(text) and len(g) < 2 * n_first[i] + 4:
                open_rows.append(i)
        if not open_rows:
            break
        more = greedy_continue(model, [prompts[i] + generated[i] for i in open_rows],
                               max(n_first[i] for i in open_rows) + 1, eot_id, logit_bias).numpy()
        for row, i in enumerate(open_rows):
            generated[i] += list(map(int, more[row]))[:2 * n_first[i] + 4 - len(generated[i])]
    return generated


def evaluate_terms(model, tokenizer, documents: list[str], tokens: np.ndarray, offsets: np.ndarray,
                   terms: list[term_search.Term], *, max_terms: int, context_tokens: int, batch_size: int,
                   eot_id: int, closed_set: bool = True, split: str = "test",
                   per_term: list[list[term_search.Occurrence]] | None = None,
                   progress: Progress | None = None, logit_bias=None) -> list[dict]:
    """One row per evaluated term occurrence (metrics/eval_occurrences.jsonl); `term_metrics` sums them up.

    At each chosen occurrence (term_search.find_occurrences, capped round robin):
    the prompt is up to `context_tokens` of the document's tokens before the first
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
    With `closed_set`, each extracted term (tokenized as lead + term) is scored after
    the same prompt by summed NLL, and `choice_rank` is 1 + the number of terms the
    model prefers to the true one (1 = the model would pick the right term from the
    list); the true term is the one as written at the occurrence, the others their
    display forms.
    """
    from rarelm.lm import candidates_nll, continuation_scores

    if per_term is None:
        per_term = term_search.find_occurrences(tokenizer, documents, tokens, offsets, terms)
    chosen = term_search.select_round_robin(per_term, max_terms)
    prompts = [term_search.prompt_before(tokens, int(offsets[o.doc]), o.start, context_tokens, eot_id)
               for o in chosen]
    covers = [[int(t) for t in tokens[o.start:o.end]] for o in chosen]
    expected = [o.lead + (o.surface or terms[o.term].text) for o in chosen]
    candidate_ids: dict[str, list[list[int]]] = {}  # lead -> every term tokenized after it
    rows: list[dict] = [{} for _ in chosen]
    order = sorted(range(len(chosen)), key=lambda i: (len(covers[i]), len(prompts[i])))
    advance = (progress or _silent)("generating terms", len(chosen))
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        generated = _generate_text(model, tokenizer, [prompts[i] for i in idx], [expected[i] for i in idx],
                                   [len(covers[i]) for i in idx], eot_id, logit_bias)
        scored = continuation_scores(model, [prompts[i] for i in idx], [covers[i] for i in idx], eot_id,
                                     logit_bias)
        nlls = [nll for nll, _ in scored]
        for row, i in enumerate(idx):
            o, term = chosen[i], terms[chosen[i].term]
            text = tokenizer.decode(generated[row], skip_special_tokens=False)
            covered = tokenizer.decode(covers[i], skip_special_tokens=False)
            rank = None
            if closed_set:
                if o.lead not in candidate_ids:
                    candidate_ids[o.lead] = [e.ids for e in tokenizer.encode_batch(
                        [o.lead + t.text for t in terms], add_special_tokens=False)]
                ids = candidate_ids[o.lead][o.term] if expected[i] == o.lead + term.text else \
                    tokenizer.encode(expected[i], add_special_tokens=False).ids  # the true term as written
                true_nll = float(nlls[row].sum()) if ids == covers[i] else \
                    candidates_nll(model, prompts[i], [ids], logit_bias=logit_bias)[0]
                scores = candidates_nll(model, prompts[i], candidate_ids[o.lead], bound=true_nll,
                                        logit_bias=logit_bias)
                scores[o.term] = true_nll  # only the others are counted against it
                rank = 1 + int((scores < true_nll).sum())
            rows[i] = {"split": split, "term": term.text, "train_count": term.count,
                       "band": term_search.band_label(term.count), "mention": o.mention, "doc": o.doc,
                       "char_start": o.char_start, "prompt_tokens": len(prompts[i]),
                       "expected": expected[i], "output": text,
                       "exact_match": text.startswith(expected[i]),
                       "exact_match_ci": text.casefold().startswith(expected[i].casefold()),
                       "first_token_hit": bool(generated[row][0] == covers[i][0]),
                       "nll": float(nlls[row].mean()),
                       **continuous_figures(*scored[row], covered),
                       "choice_rank": rank, "n_choices": len(terms) if closed_set else None}
        advance(len(idx))
    return rows


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


def _mean(values) -> float | None:
    values = [float(v) for v in values if v is not None]
    return sum(values) / len(values) if values else None


def em50_train_count(counts: np.ndarray, hits: np.ndarray) -> float | None:
    """Train occurrences at which a logistic fit of exact match on log2(train count) crosses 0.5.

    Fits P(hit) = 1 / (1 + exp(-(a + b log2 count))) by Newton's method (with a
    1e-6 ridge so a perfect separation stays finite) over occurrences of terms seen
    at least once, and returns 2^(-a/b). Undefined (None) when the fit does not rise
    with the count (b <= 0), or when the crossing lies outside the counts observed
    (it would be an extrapolation), or with fewer than two distinct counts.

    >>> c = np.array([1, 2, 4, 8, 16, 32, 64, 128] * 4)
    >>> round(em50_train_count(c, c >= 16), 1)   # hits from 16 on: the crossing is half way, at ~11
    11.3
    """
    keep = counts >= 1
    x, y = np.log2(counts[keep].astype(np.float64)), hits[keep].astype(np.float64)
    if len(np.unique(x)) < 2:
        return None
    design = np.stack([np.ones_like(x), x], axis=1)
    w = np.zeros(2)
    for _ in range(100):
        p = 0.5 * (1.0 + np.tanh(0.5 * (design @ w)))  # the logistic function, without overflow
        grad = design.T @ (y - p) - 1e-6 * w
        hess = design.T @ (design * (p * (1 - p))[:, None]) + 1e-6 * np.eye(2)
        step = np.linalg.solve(hess, grad)
        w += step
        if np.abs(step).max() < 1e-10:
            break
    a, b = w
    if b <= 0:
        return None
    crossing = -a / b
    if not x.min() <= crossing <= x.max():
        return None
    return float(2.0 ** crossing)


def _figures(rows: list[dict]) -> dict:
    """Means over some rows: exact match (as written, and in any case), first-token accuracy,
    NLL (per token, per term, per character), term-token accuracy, first-token reciprocal rank
    and closed-set choice."""
    return {"exact_match": _mean(r["exact_match"] for r in rows),
            "exact_match_ci": _mean(r.get("exact_match_ci") for r in rows),  # None: rows from before it
            "first_token_acc": _mean(r["first_token_hit"] for r in rows),
            "nll": _mean(r["nll"] for r in rows),
            "nll_per_term": _mean(r.get("nll_sum") for r in rows),
            "nll_per_char": _mean(r.get("nll_per_char") for r in rows),
            "token_acc": _mean(r.get("token_acc") for r in rows),
            "first_token_mrr": _mean(r.get("first_token_rr") for r in rows),
            "choice_acc": _mean(None if r["choice_rank"] is None else r["choice_rank"] == 1 for r in rows)}


def term_metrics(rows: list[dict], n_terms: int, n_occurrences: int) -> dict:
    """metrics/eval.json's term figures, from the per-occurrence rows alone.

    Each figure is a mean over occurrences; `*_macro` first averages each term's
    occurrences, then the terms. `_first` / `_repeat` split by mention type;
    `_band_<lo-hi>` by the term's train count; `_le15` keeps terms seen <= 15 times.
    `term_exact_match_ci` is exact match compared case folded (" Pki" for " PKI").
    """
    def block(subset: list[dict], suffix: str) -> dict:
        out = {f"term_{key}{suffix}": value for key, value in _figures(subset).items()}
        return {**out, f"n_eval_terms{suffix}": len(subset)}

    out = block(rows, "")
    by_term: dict[str, list[dict]] = {}
    for r in rows:
        by_term.setdefault(r["term"], []).append(r)
    per_term = [_figures(group) for group in by_term.values()]
    for key in ("exact_match", "first_token_acc", "choice_acc", "nll_per_char", "token_acc"):
        out[f"term_{key}_macro"] = _mean(m[key] for m in per_term)
    ranks = [r["first_token_rank"] for r in rows if r.get("first_token_rank") is not None]
    out["term_first_token_rank_median"] = float(np.median(ranks)) if ranks else None
    for mention in ("first", "repeat"):
        out.update(block([r for r in rows if r["mention"] == mention], f"_{mention}"))
    out.update(block([r for r in rows if r["train_count"] <= 15], "_le15"))
    for label, subset in _by_band(rows):
        figures = _figures(subset)
        out[f"term_exact_match_band_{label}"] = figures["exact_match"]
        out[f"term_exact_match_ci_band_{label}"] = figures["exact_match_ci"]
        out[f"term_choice_acc_band_{label}"] = figures["choice_acc"]
        out[f"n_eval_terms_band_{label}"] = len(subset)
    counts = np.array([r["train_count"] for r in rows], dtype=np.int64)
    out["em50_train_count"] = em50_train_count(counts, np.array([r["exact_match"] for r in rows], bool))
    out["n_eval_term_types"] = len(by_term)
    out["n_term_occurrences"] = n_occurrences  # found in the split, before the eval.max_terms cap
    out["n_terms"] = n_terms
    return out


def _by_band(rows: list[dict]) -> list[tuple[str, list[dict]]]:
    """(band label, its rows) for each train-count band that has rows, in band order."""
    bands: dict[int, list[dict]] = {}
    for r in rows:
        bands.setdefault(term_search.band_index(r["train_count"]), []).append(r)
    return [(term_search.band_label(group[0]["train_count"]), group) for _, group in sorted(bands.items())]


def band_rows(rows: list[dict]) -> list[dict]:
    """plots/eval_term_bands.csv: one row per train-count band."""
    return [{"band": term_search.frequency_band(group[0]["train_count"]),
             "terms": len({r["term"] for r in group}), "occurrences": len(group), **_figures(group)}
            for _, group in _by_band(rows)]


# ---------------------------------------------------------------- diversity of free generation


def sampled_continuations(model, tokens: np.ndarray, offsets: np.ndarray, *, n_prompts: int, n_new: int,
                          context_tokens: int, batch_size: int, eot_id: int, seed: int,
                          progress: Progress | None = None, logit_bias=None,
                          what: str = "sampling continuations") -> tuple[np.ndarray, np.ndarray] | None:
    """(generated, human) int64 [prompts, n_new]: `n_prompts` prompts spread evenly over the split,
    each continued by `n_new` tokens sampled at temperature 1, beside the tokens that followed it
    in the text. None when there is nothing to sample (n_prompts 0 or a split too short)."""
    import torch

    from rarelm.lm import sample_continue

    if n_prompts == 0 or len(tokens) < n_new + 2:
        return None
    positions = np.unique(np.linspace(1, len(tokens) - n_new, n_prompts).round().astype(np.int64))
    starts = term_search.document_starts(offsets, positions)
    prompts = [term_search.prompt_before(tokens, int(d), int(p), context_tokens, eot_id)
               for p, d in zip(positions, starts, strict=True)]
    human = np.stack([np.asarray(tokens[p:p + n_new], dtype=np.int64) for p in positions])
    advance = (progress or _silent)(what, len(prompts))
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


# ---------------------------------------------------------------- false insertion


def count_terms(texts: list[str], terms: list[term_search.Term]) -> int:
    """Term occurrences in some texts, found as in the evaluated split (term_search.find_in_text).

    >>> count_terms(["the acute MI was", "acute MIs; acute MI"], [term_search.Term("acute MI", 3)])
    2
    """
    joined = "\n".join(texts)
    return sum(len(term_search.find_in_text(joined, t.text)) for t in terms if "\n" not in t.text)


def term_start_mask(per_term: list[list[term_search.Occurrence]], n_tokens: int) -> np.ndarray:
    """Boolean per split position: the first token covering a term occurrence is there."""
    mask = np.zeros(n_tokens, dtype=bool)
    for occurrences in per_term:
        for o in occurrences:
            mask[o.start] = True
    return mask


def insertion_rates(generated: list[str], human: list[str], n_generated: int, n_human: int,
                    terms: list[term_search.Term], text_occurrences: int, text_tokens: int) -> dict:
    """False insertion (a): extracted terms per 1,000 tokens written by the model vs in the text.

    `false_insertion_gen_per_1k`: in the sampled continuations; `_human_per_1k`: in the text
    that followed the same prompts; `_text_per_1k`: in the whole split (its term occurrences
    over its tokens); `false_insertion_rate` = gen / text (1 = the model writes terms as often
    as the text has them; above 1 it inserts terms where the text has none). A worked example:
    3 terms in 1,000 sampled tokens, 300 occurrences in a 50,000-token split: 3 vs 6 per 1,000,
    ratio 0.5.
    """
    gen = 1000.0 * count_terms(generated, terms) / n_generated
    text = _ratio(1000.0 * text_occurrences, text_tokens)
    return {"false_insertion_gen_per_1k": gen,
            "false_insertion_human_per_1k": 1000.0 * count_terms(human, terms) / n_human,
            "false_insertion_text_per_1k": text,
            "false_insertion_rate": None if not text else gen / text,
            "n_false_insertion_tokens": n_generated}


def false_insertion(model, tokenizer, tokens: np.ndarray, offsets: np.ndarray,
                    terms: list[term_search.Term], text_occurrences: int, *, n_prompts: int, n_new: int,
                    context_tokens: int, batch_size: int, eot_id: int, seed: int,
                    progress: Progress | None = None, logit_bias=None) -> dict:
    """insertion_rates on `n_prompts` continuations of `n_new` sampled tokens (sampled_continuations)."""
    sampled = sampled_continuations(model, tokens, offsets, n_prompts=n_prompts, n_new=n_new,
                                    context_tokens=context_tokens, batch_size=batch_size, eot_id=eot_id,
                                    seed=seed, progress=progress, logit_bias=logit_bias,
                                    what="sampling for false insertion")
    if sampled is None:
        return {"n_false_insertion_tokens": 0}

    def texts(rows: np.ndarray) -> list[str]:
        return [tokenizer.decode([int(t) for t in row], skip_special_tokens=False) for row in rows]

    gen, human = sampled
    return insertion_rates(texts(gen), texts(human), gen.size, human.size, terms, text_occurrences,
                           len(tokens))


# ---------------------------------------------------------------- the whole stage


@dataclasses.dataclass
class SplitResult:
    metrics: dict
    bucket_rows: list[dict]
    band_rows: list[dict]
    occurrences: list[dict]  # one row per evaluated term occurrence (evaluate_terms)


def evaluate_split(model, tokenizer, data, documents: list[str], split: str, buckets: np.ndarray,
                   terms: list[term_search.Term], params: EvalParams, seed: int,
                   progress: Progress | None = None, log_prior: np.ndarray | None = None) -> SplitResult:
    """All three measurements on one split of a TokenizedData; `documents` is its prepared text.

    `log_prior` (rare.log_prior of the train counts) is needed when eval.logit_adjust_tau > 0.
    """
    from rarelm.lm import context_length, logit_adjustment

    tokens, offsets = data.tokens(split), data.offsets(split)
    if len(tokens) and int(tokens.max()) >= len(buckets):
        raise RarelmError(f"{split} split holds token id {int(tokens.max())}, outside the vocabulary of "
                          f"{len(buckets)}; re-run the tokenize and rare_terms stages")
    limit = context_length(model)
    block = params.block_size or limit or 1024
    if limit and block > limit:
        raise RarelmError(f"params: eval.block_size = {block} is not allowed "
                          f"(must be <= the model's context length {limit})")
    per_term = term_search.find_occurrences(tokenizer, documents, tokens, offsets, terms)
    longest = max((o.end - o.start for occ in per_term for o in occ), default=1)
    context = params.context_tokens
    if limit:  # the prompt and what the model writes must fit in the model's context
        generated = max(2 * longest + 4, params.diversity_tokens if params.diversity_prompts else 0,
                        params.insertion_tokens if params.insertion_prompts else 0)
        context = min(context, limit - generated)
        if context < 1:
            raise RarelmError(f"the model's context of {limit} tokens is too short for terms of "
                              f"{longest} tokens, eval.diversity_tokens = {params.diversity_tokens} and "
                              f"eval.insertion_tokens = {params.insertion_tokens}")
    if params.logit_adjust_tau and log_prior is None:
        raise ValueError("eval.logit_adjust_tau > 0 needs the train log prior")
    bias = logit_adjustment(model, log_prior, params.logit_adjust_tau)
    stats = score_tokens(model, tokens, buckets, block, params.batch_size, progress,
                         term_search.term_token_mask(per_term, len(tokens)), logit_bias=bias,
                         start_mask=term_start_mask(per_term, len(tokens)))
    rows = evaluate_terms(model, tokenizer, documents, tokens, offsets, terms, max_terms=params.max_terms,
                          context_tokens=context, batch_size=params.batch_size, eot_id=data.eot_id,
                          closed_set=params.closed_set, split=split, per_term=per_term, progress=progress,
                          logit_bias=bias)
    div = diversity(model, tokens, offsets, buckets, n_prompts=params.diversity_prompts,
                    n_new=params.diversity_tokens, context_tokens=context, batch_size=params.batch_size,
                    eot_id=data.eot_id, seed=seed, progress=progress, logit_bias=bias)
    found = sum(map(len, per_term))
    inserted = false_insertion(model, tokenizer, tokens, offsets, terms, found,
                               n_prompts=params.insertion_prompts, n_new=params.insertion_tokens,
                               context_tokens=context, batch_size=params.batch_size, eot_id=data.eot_id,
                               seed=seed, progress=progress, logit_bias=bias)
    metrics = {**stats.metrics(), **term_metrics(rows, len(terms), found), **div, **inserted}
    return SplitResult(metrics, stats.rows(), band_rows(rows), rows)


def combine(results: dict[str, SplitResult]) -> dict:
    """metrics/eval.json: the first split's metrics at the top level, the others under their name."""
    splits = list(results)
    out = dict(results[splits[0]].metrics)
    for split in splits[1:]:
        out[split] = dict(results[split].metrics)
    return out


def mlflow_metrics(metrics: dict) -> dict[str, float]:
    """eval.json as MLflow metric names: `eval/<key>`, other splits `eval/<split>/<key>`; nulls dropped.

    >>> mlflow_metrics({"ppl": 3.5, "ppl_rare": None, "val": {"ppl": 4}})
    {'eval/ppl': 3.5, 'eval/val/ppl': 4.0}
    """
    out = {}
    for key, value in metrics.items():
        if isinstance(value, dict):
            out.update({f"eval/{key}/{k}": float(v) for k, v in value.items() if v is not None})
        elif value is not None:
            out[f"eval/{key}"] = float(value)
    return out


def log_to_mlflow(run, metrics: dict, inputs: list[str | Path] = ("data/prepared", "data/tokenized",
                                                                    "data/rare")) -> None:
    """Log metrics (`mlflow_metrics`) and `inputs` as "evaluation" datasets (digests from dvc.lock)
    into `run` (rarelm.tracking.open_run), then `run.require()`: before any output is written, a
    store that cannot log is the stage's one-line error when `tracking.required` is on."""
    from rarelm.tracking import measured, summary_metrics

    run.log_metrics(summary_metrics(metrics) | measured(mlflow_metrics(metrics)))
    if "logit_adjust_tau" in metrics:  # the setting behind these figures: a tag, not a metric
        run.set_tags({"eval.logit_adjust_tau": str(metrics["logit_adjust_tau"])})
    run.log_datasets(list(inputs), context="evaluation")
    run.require()


def log_files_to_mlflow(run, files: list[Path], log_text: bool) -> None:
    """The written outputs as artifacts under `eval/`, and finish the run.

    The per-occurrence rows (the .jsonl among `files`: expected term beside what the model
    wrote, test-corpus text) go only when `log_text` (tracking.log_text): as an artifact and
    as the MLflow table `eval/term_samples.json`. A failure here is one warning line; the
    stage's outputs stand.
    """
    import json
    import sys

    for path in files:
        if Path(path).suffix == ".jsonl" and log_text:
            with open(path, encoding="utf-8") as f:
                run.log_table([json.loads(line) for line in f], "eval/term_samples.json")
    if run.active:
        from rarelm.tracking import redact

        try:
            import mlflow

            client = mlflow.MlflowClient(run.tracking_uri)
            for path in files:
                if Path(path).suffix != ".jsonl" or log_text:
                    client.log_artifact(run.run_id, str(path), artifact_path="eval")
        except Exception as exc:  # the store answered but artifacts failed: still only a warning
            print(f"rarelm evaluate: warning: MLflow artifacts not logged ({type(exc).__name__}: "
                  f"{redact(' '.join(str(exc).split())[:200])})", file=sys.stderr)
    run.finish()
