"""The `evaluate` stage's measurements: how well a model predicts and writes rare tokens and terms.

For each split in `eval.splits`, three measurements, each with the counts behind it:

1. Teacher-forced scoring (`score_tokens`): the split is cut into consecutive,
   non-overlapping windows of `block_size` targets (every token but the first is
   a target exactly once); one forward pass per batch gives each target's NLL,
   whether it was the top-1 prediction and whether it was in the top 5. Summed
   per frequency bucket of the target (data/rare/buckets.npy: frequent, medium,
   rare, unseen-in-train), that yields `ppl`, `ppl_<bucket>`, `acc_<bucket>`,
   `recall_at_5_<bucket>`, `rare_token_acc`, `rare_token_recall_at_5`.
2. Rare-term generation (`evaluate_terms`): every occurrence of a term of
   data/rare/terms.jsonl in the split (capped at `eval.max_terms`, round robin
   over terms); prompt = up to `eval.context_tokens` tokens before it in its
   document; greedy decode as many tokens as the term has. `term_exact_match`
   (all tokens right), `term_first_token_acc`, `term_nll` (mean per-token NLL of
   the term given the prompt, averaged over occurrences), also per band of the
   term's train count (plots/eval_term_bands.csv).
3. Diversity (`diversity`): `eval.diversity_prompts` prompts spread evenly over
   the split, each continued by `eval.diversity_tokens` tokens sampled at
   temperature 1 (the model's own distribution), against the human text that
   followed: unique tokens and share of rare-bucket tokens for both.

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
RARE = BUCKETS.index("rare")

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
    """Per-bucket sums over scored targets (index = bucket id)."""

    tokens: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(len(BUCKETS), np.int64))
    nll: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(len(BUCKETS), np.float64))
    top1: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(len(BUCKETS), np.int64))
    top5: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(len(BUCKETS), np.int64))

    def add(self, bucket: np.ndarray, nll: np.ndarray, top1: np.ndarray, top5: np.ndarray) -> None:
        size = len(BUCKETS)
        self.tokens += np.bincount(bucket, minlength=size)
        self.nll += np.bincount(bucket, weights=nll, minlength=size)
        self.top1 += np.bincount(bucket, weights=top1, minlength=size).astype(np.int64)
        self.top5 += np.bincount(bucket, weights=top5, minlength=size).astype(np.int64)

    def metrics(self) -> dict:
        n = int(self.tokens.sum())
        out = {"ppl": _ppl(float(self.nll.sum()), n), "token_acc": _ratio(int(self.top1.sum()), n),
               "token_recall_at_5": _ratio(int(self.top5.sum()), n), "n_eval_tokens": n}
        for b, name in enumerate(BUCKETS):
            k = int(self.tokens[b])
            out[f"ppl_{name}"] = _ppl(float(self.nll[b]), k)
            out[f"acc_{name}"] = _ratio(int(self.top1[b]), k)
            out[f"recall_at_5_{name}"] = _ratio(int(self.top5[b]), k)
            out[f"n_tokens_{name}"] = k
        out["rare_token_acc"] = out["acc_rare"]
        out["rare_token_recall_at_5"] = out["recall_at_5_rare"]
        return out

    def rows(self) -> list[dict]:
        """Plot rows: one per non-empty bucket and one for all tokens."""
        m = self.metrics()
        rows = [{"bucket": "all", "tokens": m["n_eval_tokens"], "ppl": m["ppl"], "acc": m["token_acc"],
                 "recall_at_5": m["token_recall_at_5"]}]
        for name in BUCKETS:
            if m[f"n_tokens_{name}"]:
                rows.append({"bucket": name, "tokens": m[f"n_tokens_{name}"], "ppl": m[f"ppl_{name}"],
                             "acc": m[f"acc_{name}"], "recall_at_5": m[f"recall_at_5_{name}"]})
        return rows


def _score_batch(model, windows: np.ndarray, buckets: np.ndarray, stats: TokenStats) -> None:
    import torch

    ids = torch.as_tensor(windows.astype(np.int64), device=model.device)
    inputs, targets = ids[:, :-1], ids[:, 1:]
    with torch.no_grad():
        logits = model(input_ids=inputs).logits.float()
    target_logit = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    nll = torch.logsumexp(logits, dim=-1) - target_logit
    top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices  # sorted: top[..., 0] is the argmax
    hit1 = top[..., 0] == targets
    hit5 = (top == targets.unsqueeze(-1)).any(-1)
    flat = targets.reshape(-1).cpu().numpy()
    stats.add(buckets[flat], nll.reshape(-1).double().cpu().numpy(),
              hit1.reshape(-1).cpu().numpy(), hit5.reshape(-1).cpu().numpy())


def score_tokens(model, tokens: np.ndarray, buckets: np.ndarray, block_size: int, batch_size: int,
                 progress: Progress | None = None) -> TokenStats:
    """Teacher-forced NLL / top-1 / top-5 of every token after the first, summed per bucket."""
    stats = TokenStats()
    n = len(tokens)
    starts = np.arange(0, max(n - 1, 0), block_size)
    advance = (progress or _silent)("scoring tokens", max(n - 1, 0))
    for b in range(0, len(starts), batch_size):
        batch = starts[b:b + batch_size]
        targets = np.minimum(block_size, n - 1 - batch)  # only the split's last window is shorter
        for length in np.unique(targets):
            rows = [tokens[s:s + length + 1] for s in batch[targets == length]]
            _score_batch(model, np.stack(rows), buckets, stats)
        advance(int(targets.sum()))
    return stats


# ---------------------------------------------------------------- rare-term generation


def evaluate_terms(model, tokens: np.ndarray, offsets: np.ndarray, terms: list[term_search.Term],
                   *, max_terms: int, context_tokens: int, batch_size: int, eot_id: int,
                   joins_word: np.ndarray | None = None, progress: Progress | None = None,
                   samples: list[dict] | None = None) -> tuple[dict, list[dict]]:
    """Greedy term generation at each chosen occurrence; returns (metrics, rows per frequency band).

    With a `samples` list, every occurrence's record is appended to it (term, prompt,
    expected and generated token ids, scores), for people to read what the model wrote.
    """
    from rarelm.lm import continuation_nll, greedy_continue

    per_term = term_search.find_occurrences(tokens, terms, joins_word)
    chosen = term_search.select_round_robin(per_term, max_terms)
    starts = term_search.document_starts(offsets, np.array([o.position for o in chosen], dtype=np.int64))
    prompts = [term_search.prompt_before(tokens, int(d), o.position, context_tokens, eot_id)
               for o, d in zip(chosen, starts, strict=True)]
    # batch occurrences of equal term length and similar prompt length together: less padding
    order = sorted(range(len(chosen)), key=lambda i: (len(chosen[i].sequence), len(prompts[i])))
    exact = np.zeros(len(chosen), dtype=bool)
    first = np.zeros(len(chosen), dtype=bool)
    nll = np.zeros(len(chosen), dtype=np.float64)
    outputs: list[list[int]] = [[] for _ in chosen]
    advance = (progress or _silent)("generating terms", len(chosen))
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        batch_prompts = [prompts[i] for i in idx]
        seqs = [list(chosen[i].sequence) for i in idx]
        generated = greedy_continue(model, batch_prompts, max(map(len, seqs)), eot_id).numpy()
        term_nll = continuation_nll(model, batch_prompts, seqs, eot_id)
        for row, i in enumerate(idx):
            seq = np.asarray(seqs[row])
            exact[i] = bool((generated[row, :len(seq)] == seq).all())
            first[i] = bool(generated[row, 0] == seq[0])
            nll[i] = float(term_nll[row].mean())
            outputs[i] = generated[row, :len(seq)].tolist()
        advance(len(idx))
    if samples is not None:
        samples.extend({"term": terms[o.term].text, "band": term_search.frequency_band(terms[o.term].count),
                        "position": o.position, "prompt": prompts[i], "expected": list(o.sequence),
                        "generated": outputs[i], "exact": bool(exact[i]), "first_token": bool(first[i]),
                        "nll": float(nll[i])} for i, o in enumerate(chosen))

    n = len(chosen)
    evaluated_terms = {o.term for o in chosen}
    metrics = {
        "term_exact_match": _ratio(int(exact.sum()), n),
        "term_first_token_acc": _ratio(int(first.sum()), n),
        "term_nll": _ratio(float(nll.sum()), n),
        "n_eval_terms": n,  # occurrences evaluated (the count behind the three figures above)
        "n_eval_term_types": len(evaluated_terms),
        "n_term_occurrences": sum(map(len, per_term)),  # found in the split, before the cap
        "n_terms": len(terms),
    }
    bands: dict[str, list[int]] = {}
    for i, o in enumerate(chosen):
        bands.setdefault(term_search.frequency_band(terms[o.term].count), []).append(i)
    rows = []
    for band in sorted(bands):
        idx = np.asarray(bands[band])
        rows.append({"band": band, "terms": len({chosen[i].term for i in idx}), "occurrences": len(idx),
                     "exact_match": float(exact[idx].mean()), "first_token_acc": float(first[idx].mean()),
                     "nll": float(nll[idx].mean())})
    return metrics, rows


# ---------------------------------------------------------------- diversity of free generation


def diversity(model, tokens: np.ndarray, offsets: np.ndarray, buckets: np.ndarray, *, n_prompts: int,
              n_new: int, context_tokens: int, batch_size: int, eot_id: int, seed: int,
              progress: Progress | None = None) -> dict:
    """Unique tokens and rare-bucket share: sampled continuations vs the human text that followed."""
    import torch

    from rarelm.lm import sample_continue

    if n_prompts == 0 or len(tokens) < n_new + 2:
        return {"n_gen_tokens": 0}
    positions = np.unique(np.linspace(1, len(tokens) - n_new, n_prompts).round().astype(np.int64))
    starts = term_search.document_starts(offsets, positions)
    prompts = [term_search.prompt_before(tokens, int(d), int(p), context_tokens, eot_id)
               for p, d in zip(positions, starts, strict=True)]
    human = np.stack([np.asarray(tokens[p:p + n_new], dtype=np.int64) for p in positions])
    advance = (progress or _silent)("sampling continuations", len(prompts))
    torch.manual_seed(seed)
    generated = []
    for b in range(0, len(prompts), batch_size):
        generated.append(sample_continue(model, prompts[b:b + batch_size], n_new, eot_id).numpy())
        advance(len(prompts[b:b + batch_size]))
    gen = np.concatenate(generated)

    def bucket_of(ids: np.ndarray) -> np.ndarray:  # ids past the tokenizer's vocabulary count as unseen
        safe = np.minimum(ids, len(buckets) - 1)
        return np.where(ids < len(buckets), buckets[safe], BUCKETS.index("unseen"))

    return {"gen_unique_tokens": int(len(np.unique(gen))), "human_unique_tokens": int(len(np.unique(human))),
            "gen_rare_share": float((bucket_of(gen) == RARE).mean()),
            "human_rare_share": float((bucket_of(human) == RARE).mean()),
            "n_gen_tokens": int(gen.size)}


# ---------------------------------------------------------------- the whole stage


@dataclasses.dataclass
class SplitResult:
    metrics: dict
    bucket_rows: list[dict]
    band_rows: list[dict]
    term_samples: list[dict]  # one record per evaluated term occurrence (see evaluate_terms)


def evaluate_split(model, data, split: str, buckets: np.ndarray, terms: list[term_search.Term],
                   params: EvalParams, seed: int, joins_word: np.ndarray | None = None,
                   progress: Progress | None = None) -> SplitResult:
    """All three measurements on one split of a TokenizedData."""
    from rarelm.lm import context_length

    tokens, offsets = data.tokens(split), data.offsets(split)
    if len(tokens) and int(tokens.max()) >= len(buckets):
        raise RarelmError(f"{split} split holds token id {int(tokens.max())}, outside the vocabulary of "
                          f"{len(buckets)}; re-run the tokenize and rare_terms stages")
    limit = context_length(model)
    block = params.block_size or limit or 1024
    if limit and block > limit:
        raise RarelmError(f"params: eval.block_size = {block} is not allowed "
                          f"(must be <= the model's context length {limit})")
    longest = max((len(s) for t in terms for s in t.sequences), default=1)
    context = params.context_tokens
    if limit:  # the prompt and the generated term must fit in the model's context
        generated = max(longest, params.diversity_tokens if params.diversity_prompts else 0)
        context = min(context, limit - generated)
        if context < 1:
            raise RarelmError(f"the model's context of {limit} tokens is too short for terms of "
                              f"{longest} tokens and eval.diversity_tokens = {params.diversity_tokens}")
    stats = score_tokens(model, tokens, buckets, block, params.batch_size, progress)
    samples: list[dict] = []
    term_metrics, band_rows = evaluate_terms(
        model, tokens, offsets, terms, max_terms=params.max_terms, context_tokens=context,
        batch_size=params.batch_size, eot_id=data.eot_id, joins_word=joins_word, progress=progress,
        samples=samples)
    div = diversity(model, tokens, offsets, buckets, n_prompts=params.diversity_prompts,
                    n_new=params.diversity_tokens, context_tokens=context, batch_size=params.batch_size,
                    eot_id=data.eot_id, seed=seed, progress=progress)
    return SplitResult({**stats.metrics(), **term_metrics, **div}, stats.rows(), band_rows, samples)


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


def log_to_mlflow(run_file: str | Path, metrics: dict, artifacts: list[Path]) -> bool:
    """Log metrics and files (under `eval/`) into the training run named in run_file.

    Never raises: a missing run file or an unreachable store is one warning line
    on stderr, and the stage's own outputs stand. Returns whether it logged.
    """
    import sys

    from rarelm.tracking import open_run

    if not Path(run_file).is_file():
        print(f"rarelm evaluate: warning: no {run_file} (the model was trained without tracking); "
              "metrics not logged to MLflow", file=sys.stderr)
        return False
    run = open_run(run_file, stage="evaluate")
    if not run.active:
        return False  # open_run printed the warning line
    run.log_metrics(mlflow_metrics(metrics))
    if run.active:
        try:
            import mlflow

            client = mlflow.MlflowClient(run.tracking_uri)
            for path in artifacts:
                client.log_artifact(run.run_id, str(path), artifact_path="eval")
        except Exception as exc:  # the store answered but artifacts failed: still only a warning
            print(f"rarelm evaluate: warning: MLflow artifacts not logged ({type(exc).__name__}: "
                  f"{' '.join(str(exc).split())[:200]})", file=sys.stderr)
    logged = run.active
    run.finish()
    return logged
