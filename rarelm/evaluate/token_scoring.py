"""Teacher-forced scoring of every token of a split, summed per frequency bucket and on term tokens.

The split is cut into consecutive, non-overlapping windows of `block_size`
targets (every token but the first is a target exactly once); one forward pass per
batch gives each target's NLL, whether it was the top-1 prediction and whether it
was in the top 5. Summed per frequency bucket of the target (data/rare/buckets.npy:
frequent, medium, rare, unseen-in-train), that yields `ppl`, `ppl_<bucket>`,
`acc_<bucket>`, `recall_at_5_<bucket>`, `rare_token_acc`, `rare_token_recall_at_5`;
the tokens covering term occurrences are also scored as their own class (`ppl_term`,
`acc_term`, `recall_at_5_term`), and the model's probability mass on term-start tokens
where no term starts (`false_insertion_start_mass`).

A worked example with a model whose predictions are known: if the targets are
[a, b] with probabilities 0.5 and 0.25 under the model, ppl = exp((ln 2 + ln 4) / 2)
= sqrt(8) ~ 2.83; if a is frequent and b rare, ppl_frequent = 2, ppl_rare = 4.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from rarelm.evaluate import prefix, retrieval
from rarelm.evaluate.common import EvalContext, ratio
from rarelm.evaluate.decoding import context_length
from rarelm.evaluate.scoring import keeps_logits

BUCKETS = ("frequent", "medium", "rare", "unseen")
CLASSES = (*BUCKETS, "term")  # "term": tokens covering a term occurrence (also in their bucket)
RARE, TERM = BUCKETS.index("rare"), CLASSES.index("term")


def _ppl(nll_sum: float, n: int) -> float | None:
    return None if n == 0 else math.exp(nll_sum / n)


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
        out = {"ppl": _ppl(float(self.nll[:b].sum()), n), "token_acc": ratio(int(self.top1[:b].sum()), n),
               "token_recall_at_5": ratio(int(self.top5[:b].sum()), n), "n_eval_tokens": n}
        for c, name in enumerate(CLASSES):
            k = int(self.tokens[c])
            out[f"ppl_{name}"] = _ppl(float(self.nll[c]), k)
            out[f"acc_{name}"] = ratio(int(self.top1[c]), k)
            out[f"recall_at_5_{name}"] = ratio(int(self.top5[c]), k)
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
        return {"false_insertion_start_mass": ratio(float(mass[0]), int(n[0])),
                "false_insertion_start_freq": ratio(int(hits[0]), int(n[0])),
                "term_start_mass": ratio(float(mass[1]), int(n[1])),
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


# Rows of logits post-processed at a time: 128 x 8,192 fp32 = 4 MB stays in cache, where a whole
# batch of 32 x 128 rows is 134 MB that each of logsumexp's passes (max, exp, sum) streams from
# memory. The values are the same bit for bit (each row is reduced alone either way); the scoring
# runs 1.18x faster on one thread at base size (bench/token_scoring.py, docs/benchmarks.md).
ROWS = 128


def _score_rows(logits: torch.Tensor, targets: torch.Tensor, start_ids) -> tuple:
    """Per row of (rows, vocab) logits: NLL, top-1 hit, top-5 hit and, with `start_ids`, the mass
    on term-start tokens and whether the target is one."""
    target_logit = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    log_norm = torch.logsumexp(logits, dim=-1)
    mass = hit = None
    if start_ids is not None:
        mass = torch.exp(torch.logsumexp(logits[:, start_ids], dim=-1) - log_norm)
        hit = torch.isin(targets, start_ids)
    top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices  # sorted: top[:, 0] is the argmax
    return log_norm - target_logit, top[:, 0] == targets, (top == targets.unsqueeze(-1)).any(-1), mass, hit


def _score_batch(ctx: EvalContext, windows: np.ndarray, skip: int, start_ids) -> tuple:
    """Per target of `windows` [rows, 1 + targets], each row led by `skip` tokens that are context
    only (the lead, retrieved passages), as numpy arrays: the target, its NLL, top-1 hit, top-5 hit,
    and with `start_ids` (else None) the pair (mass on term-start tokens, whether the target is one)."""
    model = ctx.model
    ids = torch.as_tensor(windows.astype(np.int64), device=model.device)
    inputs, targets = ids[:, :-1], ids[:, 1 + skip:].reshape(-1)
    scored = inputs.shape[1] - skip
    keep = {"logits_to_keep": scored} if skip and keeps_logits(model) else {}
    with torch.no_grad():
        logits = model(input_ids=inputs, use_cache=False, **keep).logits[:, -scored:].float()
        if ctx.logit_bias is not None:
            logits = logits + ctx.logit_bias
        chunks = zip(logits.reshape(len(targets), -1).split(ROWS), targets.split(ROWS), strict=True)
        parts = [_score_rows(rows, chunk, start_ids) for rows, chunk in chunks]
    nll, hit1, hit5, mass, hit = (None if p[0] is None else torch.cat(p) for p in zip(*parts, strict=True))
    mass_hit = None if start_ids is None else (mass.double().cpu().numpy(), hit.cpu().numpy())
    return (targets.cpu().numpy(), *(x.cpu().numpy() for x in (nll.double(), hit1, hit5)), mass_hit)


def score_tokens(ctx: EvalContext, tokens: np.ndarray, buckets: np.ndarray, block_size: int,
                 term_mask: np.ndarray | None = None, start_mask: np.ndarray | None = None) -> TokenStats:
    """Teacher-forced NLL / top-1 / top-5 of every token after the first, summed per class, in batches
    of eval.batch_size windows of `block_size` targets.

    `term_mask` (bool per split position) marks the tokens that cover a term occurrence;
    `start_mask` the first covering token of each occurrence: the tokens found there are the
    term-start tokens whose probability mass TokenStats.start_metrics reports. eval.max_tokens > 0
    scores only the windows `budget_windows` keeps, spread evenly over the split.
    """
    stats = TokenStats()
    n = len(tokens)
    if term_mask is None:
        term_mask = np.zeros(n, dtype=bool)
    start_ids = None
    if start_mask is not None and start_mask.any():
        ids = np.unique(np.asarray(tokens)[start_mask]).astype(np.int64)
        stats.n_start_ids = len(ids)
        start_ids = torch.as_tensor(ids, device=ctx.model.device)
    skip = prefix.width()  # the lead (<bos>) and retrieved passages before every window: context only
    if skip:
        retrieval.check_fits(block_size, skip, context_length(ctx.model))
    starts = budget_windows(np.arange(0, max(n - 1, 0), block_size), block_size, ctx.params.max_tokens)
    advance = ctx.advance("scoring tokens", int(np.minimum(block_size, n - 1 - starts).sum()))
    for b in range(0, len(starts), ctx.params.batch_size):
        batch = starts[b:b + ctx.params.batch_size]
        targets = np.minimum(block_size, n - 1 - batch)  # only the split's last window is shorter
        for length in np.unique(targets):
            first = batch[targets == length]
            rows = [tokens[s:s + length + 1] for s in first]
            if skip:  # the lead, then the passages found for the text before each window's targets
                rows = _with_prefix(tokens, first, rows)
            flat, nll, hit1, hit5, mass_hit = _score_batch(ctx, np.stack(rows), skip, start_ids)
            if mass_hit is not None:
                at_start = np.stack([start_mask[s + 1:s + length + 1] for s in first])
                stats.add_starts(at_start.reshape(-1), *mass_hit)
            stats.add(buckets[flat], nll, hit1, hit5)
            term = np.stack([term_mask[s + 1:s + length + 1] for s in first]).reshape(-1)
            if term.any():
                stats.add(np.full(int(term.sum()), TERM), nll[term], hit1[term], hit5[term])
        advance(int(targets.sum()))
    return stats


def _with_prefix(tokens: np.ndarray, starts: np.ndarray, rows: list) -> list[np.ndarray]:
    """Each window led by its prefix (rarelm/evaluate/prefix.py): the model's lead, then the passages
    retrieved for the text before its first target."""
    found = prefix.prefixes([tokens[:s + 1] for s in starts])
    return [np.concatenate([np.asarray(p, dtype=np.int64), np.asarray(row, dtype=np.int64)])
            for p, row in zip(found, rows, strict=True)]


def budget_windows(starts: np.ndarray, block_size: int, max_tokens: int) -> np.ndarray:
    """The window starts to score under a budget of `max_tokens` (0: all): enough windows, spread
    evenly over the split, the same for every run.

    >>> budget_windows(np.arange(0, 100, 10), 10, 30).tolist()
    [0, 40, 90]
    >>> budget_windows(np.arange(0, 30, 10), 10, 0).tolist()
    [0, 10, 20]
    """
    keep = -(-max_tokens // block_size)
    if not max_tokens or keep >= len(starts):
        return starts
    return starts[np.unique(np.linspace(0, len(starts) - 1, keep).round().astype(np.int64))]
