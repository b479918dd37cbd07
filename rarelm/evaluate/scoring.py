"""Teacher-forced scores of given continuations: NLL and rank per token, and the NLL of many
candidate continuations after one prompt (a trie over their tokens, sharing the KV cache).

`logit_bias` is as in rarelm.evaluate.decoding: None = the model as trained.
"""

from __future__ import annotations

import numpy as np
import torch


def _log_softmax(logits, logit_bias):
    """float32 log-probabilities of (adjusted) logits."""
    logits = logits.float()
    return torch.log_softmax(logits if logit_bias is None else logits + logit_bias, dim=-1)


def continuation_nll(model, prompts: list[list[int]], continuations: list[list[int]], pad_id: int,
                     logit_bias=None):
    """Teacher-forced NLL (nats) of each continuation token given its prompt: a list of float arrays."""
    return [nll for nll, _ in continuation_scores(model, prompts, continuations, pad_id, logit_bias)]


def continuation_scores(model, prompts: list[list[int]], continuations: list[list[int]], pad_id: int,
                        logit_bias=None):
    """Per continuation token given its prompt: (NLL in nats, rank) as two arrays per row.

    rank = 1 + the number of vocabulary tokens with a strictly higher probability
    at that position (1 = the top-1 prediction). One right-padded forward pass per
    call: prompt + continuation, scored at the continuation's positions. Right
    padding needs no position ids, and padding after a sequence cannot change a
    causal model's outputs before it.

    Worked example: next-token probabilities (0.5, 0.25, 0.25) and a true token 1
    give NLL ln 4 = 1.386 and rank 2 (token 0 is above it; token 2 ties, not above).
    """
    seqs = [p + c for p, c in zip(prompts, continuations, strict=True)]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, seq in enumerate(seqs):
        ids[row, :len(seq)] = torch.as_tensor(seq)
        mask[row, :len(seq)] = 1
    with torch.no_grad():
        logits = model(input_ids=ids.to(model.device), attention_mask=mask.to(model.device)).logits
    logprobs = _log_softmax(logits, logit_bias).cpu()
    out = []
    for row, (prompt, cont) in enumerate(zip(prompts, continuations, strict=True)):
        positions = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(cont))
        scores = logprobs[row, positions]  # [len(cont), V]
        true = scores.gather(-1, torch.as_tensor(cont)[:, None])
        ranks = 1 + (scores > true).sum(-1)
        out.append(((-true[:, 0]).double().numpy(), ranks.numpy().astype(np.int64)))
    return out


def candidates_nll(model, prompt: list[int], candidates: list[list[int]], bound: float = float("inf"),
                   logit_bias=None):
    """Summed NLL (nats) of each candidate continuation after one prompt: float64 array [len(candidates)].

    The candidates are walked as a trie, one token position at a time: the prompt
    runs once, then each step feeds the last token of every open prefix as one
    batch, the prompt's KV cache repeated per prefix (so " acute MI" and " acute
    asthma" share the step for " acute"). Scoring 300 terms costs a few batched
    one-token steps, not 300 passes over the prompt.

    With a `bound`, a prefix whose NLL already reaches `bound` is not extended:
    every candidate below it gets `inf` (its NLL is >= bound either way). Ranking
    the candidates against one of them (bound = its NLL) is then exact and expands
    only the prefixes that could still beat it. A model that returns no cache is
    scored on prompt + prefix in full at each step (same result).
    """
    device = model.device
    out = np.full(len(candidates), np.inf)
    children: dict[tuple, list[int]] = {}  # prefix -> next tokens of candidates that continue it
    ends: dict[tuple, list[int]] = {}  # prefix -> candidates that are exactly this prefix
    for i, cand in enumerate(candidates):
        ends.setdefault(tuple(cand), []).append(i)
        for k in range(len(cand)):
            nxt = children.setdefault(tuple(cand[:k]), [])
            if cand[k] not in nxt:
                nxt.append(cand[k])
    with torch.no_grad():
        first = model(input_ids=torch.as_tensor([prompt], device=device), use_cache=True)
        cache = getattr(first, "cache", None)
        logp = _log_softmax(first.logits[:, -1], logit_bias).double().cpu().numpy()
        nodes, nll = [()], [0.0]
        while nodes:
            grown, grown_nll, parent = [], [], []
            for j, (prefix, base) in enumerate(zip(nodes, nll, strict=True)):
                for token in children.get(prefix, ()):
                    child, value = prefix + (token,), base - logp[j, token]
                    for i in ends.get(child, ()):
                        out[i] = value
                    if value < bound and child in children:
                        grown.append(child)
                        grown_nll.append(value)
                        parent.append(j)
            if not grown:
                break
            if cache is not None:
                cache.batch_select_indices(torch.as_tensor(parent, device=device))
                step = torch.as_tensor([[c[-1]] for c in grown], device=device)
                logits = model(input_ids=step, cache=cache, use_cache=True).logits[:, -1]
            else:
                full = torch.as_tensor([prompt + list(c) for c in grown], device=device)
                logits = model(input_ids=full).logits[:, -1]
            logp = _log_softmax(logits, logit_bias).double().cpu().numpy()
            nodes, nll = grown, grown_nll
    return out
