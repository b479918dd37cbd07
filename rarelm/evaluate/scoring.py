"""Teacher-forced scores of given continuations: NLL and rank per token, and the NLL of many
candidate continuations after one prompt (a trie over their tokens, sharing the KV cache):
`tree_candidates_nll` scores every open prefix of one length in one forward over a single
sequence (a tree attention mask), `candidates_nll` one row per open prefix (the per-occurrence
path of `eval.batch_size` 1).

`logit_bias` is as in rarelm.evaluate.decoding: None = the model as trained.
"""

from __future__ import annotations

import inspect

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
    # logits only from the first scored position on (the prompts' own positions are not scored): the
    # output layer and the softmax over the vocabulary were most of this pass, for 64-token prompts
    # and 2-3 token terms (docs/evaluation.md, "Cost of the user-facing metrics")
    keep = width - min(len(p) for p in prompts) + 1
    extra = {"logits_to_keep": keep} if keeps_logits(model) else {}
    with torch.no_grad():
        logits = model(input_ids=ids.to(model.device), attention_mask=mask.to(model.device), **extra).logits
    offset = width - logits.shape[1]  # 0 for a model that returns every position's logits
    logprobs = _log_softmax(logits, logit_bias).cpu()
    out = []
    for row, (prompt, cont) in enumerate(zip(prompts, continuations, strict=True)):
        positions = torch.arange(len(prompt) - 1, len(prompt) - 1 + len(cont)) - offset
        scores = logprobs[row, positions]  # [len(cont), V]
        true = scores.gather(-1, torch.as_tensor(cont)[:, None])
        ranks = 1 + (scores > true).sum(-1)
        out.append(((-true[:, 0]).double().numpy(), ranks.numpy().astype(np.int64)))
    return out


def keeps_logits(model) -> bool:
    """Whether the model's forward takes `logits_to_keep` (transformers' causal LMs: the last k positions'
    logits only)."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def _trie(candidates: list[list[int]]) -> tuple[dict[tuple, list[int]], dict[tuple, list[int]]]:
    """(children, ends): prefix -> next tokens of the candidates that continue it, and prefix ->
    the candidates that are exactly it.

    >>> _trie([[4, 5], [4], [6]])
    ({(): [4, 6], (4,): [5]}, {(4, 5): [0], (4,): [1], (6,): [2]})
    """
    children: dict[tuple, list[int]] = {}
    ends: dict[tuple, list[int]] = {}
    for i, cand in enumerate(candidates):
        ends.setdefault(tuple(cand), []).append(i)
        for k in range(len(cand)):
            nxt = children.setdefault(tuple(cand[:k]), [])
            if cand[k] not in nxt:
                nxt.append(cand[k])
    return children, ends


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
    children, ends = _trie(candidates)
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


def tree_candidates_nll(model, prompt: list[int], candidates: list[list[int]], bound: float = float("inf"),
                        logit_bias=None):
    """candidates_nll's sums (to float32 rounding) and pruning, every open prefix of one length in one
    forward of batch size 1: no copy of the prompt's KV cache per prefix.

    The trie is laid out as one sequence after the prompt, a level at a time; a tree
    attention mask lets each prefix's last token see the prompt, the tokens of its own
    prefix and itself, at the position it would have after the prompt. With the prompt
    [5, 6] and the candidates [[4, 5], [4, 7], [6]], the prompt's last logits score 4 and 6,
    then one forward of one token (4 at position 2, seeing 5, 6, 4) scores 5 and 7. A
    level of 700 prefixes is one forward of 700 tokens against the prompt's cache, where
    candidates_nll copies that cache 700 times (most of its time on 1,000 real terms).
    A model that returns no cache, or has sliding-window layers (Gemma 3: their cache keeps the
    last window only, which a tree mask over every position cannot address), is scored by
    candidates_nll.
    """
    if _sliding_window(model):
        return candidates_nll(model, prompt, candidates, bound, logit_bias)
    device, width = model.device, len(prompt)
    out = np.full(len(candidates), np.inf)
    children, ends = _trie(candidates)
    with torch.no_grad():
        first = model(input_ids=torch.as_tensor([prompt], device=device), use_cache=True)
        cache = getattr(first, "cache", None)
        if cache is None:
            return candidates_nll(model, prompt, candidates, bound, logit_bias)
        logp = _log_softmax(first.logits[0, -1:], logit_bias)
        nodes, nll, slots = [()], [0.0], [()]  # slots: where a prefix's tokens sit after the prompt
        placed = 0  # trie tokens in the cache so far
        while nodes:
            wanted = [(j, token) for j, prefix in enumerate(nodes) for token in children.get(prefix, ())]
            if not wanted:  # no candidate with a token
                break
            rows, cols = zip(*wanted, strict=True)
            token_logp = logp[list(rows), list(cols)].double().cpu().numpy()
            grown, grown_nll, grown_slots = [], [], []
            for (j, token), lp in zip(wanted, token_logp, strict=True):
                child, value = nodes[j] + (token,), nll[j] - lp
                for i in ends.get(child, ()):
                    out[i] = value
                if value < bound and child in children:
                    grown_slots.append(slots[j] + (width + placed + len(grown),))
                    grown.append(child)
                    grown_nll.append(value)
            if not grown:
                break
            placed += len(grown)
            logits = model(input_ids=torch.as_tensor([[c[-1] for c in grown]], device=device), cache=cache,
                           attention_mask=_tree_mask(grown_slots, width, width + placed).to(device),
                           position_ids=torch.as_tensor([[width + len(c) - 1 for c in grown]], device=device),
                           use_cache=True).logits[0]
            logp = _log_softmax(logits, logit_bias)
            nodes, nll, slots = grown, grown_nll, grown_slots
    return out


def _sliding_window(model) -> bool:
    """Whether any layer of the model attends within a sliding window (config.layer_types).

    >>> from types import SimpleNamespace as NS
    >>> _sliding_window(NS(config=NS(layer_types=["sliding_attention", "full_attention"])))
    True
    >>> _sliding_window(NS(config=NS()))
    False
    """
    return any("sliding" in str(kind) for kind in getattr(model.config, "layer_types", None) or ())


def _tree_mask(slots: list[tuple[int, ...]], prompt_width: int, total: int):
    """Bool attention mask [1, 1, len(slots), total]: row r sees the prompt and its slots.

    >>> _tree_mask([(2,), (3,)], 2, 4).int()[0, 0].tolist()
    [[1, 1, 1, 0], [1, 1, 0, 1]]
    """
    mask = torch.zeros((1, 1, len(slots), total), dtype=torch.bool)
    mask[..., :prompt_width] = True
    rows = [r for r, s in enumerate(slots) for _ in s]
    mask[0, 0, rows, [k for s in slots for k in s]] = True
    return mask
