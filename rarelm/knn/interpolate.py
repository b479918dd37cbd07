"""The next-token distribution of kNN-LM and of a continuous cache, and their mix with the model's.

kNN-LM (Khandelwal et al., "Generalization through Memorization", ICLR 2020): the query q is
the model's final hidden state at the current position; its k nearest keys in the datastore
(squared L2 distance d) vote for the token that followed them,

    p_kNN(w) = sum over neighbours j with value w of exp(-d(q, k_j) / T) / Z,

or, with knn.similarity cosine, exp(cos(q, k_j) / T): the same temperature on any model.

Continuous cache (Grave et al., "Improving Neural Language Models with a Continuous Cache",
ICLR 2017): the same over the current document's own last `cache_window` positions i, scored
by a dot product,

    p_cache(w) = sum over i with token_{i+1} = w of exp(h_t . h_i / T_cache) / Z.

The mix is in probability space, computed as a log-sum-exp of log-probabilities:

    p(w) = (1 - lam_knn - lam_cache) p_LM(w) + lam_knn p_kNN(w) + lam_cache p_cache(w).

Where a part has nothing to say (an empty datastore; the first position of a document, with
no history) its weight goes to the model, so every row still sums to 1.

Worked example (tests/test_knn.py): a vocabulary of 3, p_LM = (0.5, 0.3, 0.2), three neighbours
at squared distances (0, ln 2, ln 4) with values (1, 1, 2) and T = 1: weights (1, 1/2, 1/4) / (7/4),
so p_kNN = (0, 6/7, 1/7); with lam_knn = 0.5 and no cache, p = (0.25, 0.5786, 0.1714).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def vote_weights(scores: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(scores) over the valid candidates [..., n] float32; a row with none is all 0.

    >>> vote_weights(torch.tensor([[0.0, 0.0, 5.0]]), torch.tensor([[True, True, False]])).tolist()
    [[0.5, 0.5, 0.0]]
    """
    scores = scores.float()
    if scores.shape[-1] == 0:
        return scores
    if valid is not None:
        scores = scores.masked_fill(~valid, -math.inf)
    top = scores.amax(-1, keepdim=True)
    weights = torch.exp(scores - torch.where(torch.isfinite(top), top, torch.zeros_like(top)))
    total = weights.sum(-1, keepdim=True)
    return torch.where(total > 0, weights / total.clamp_min(torch.finfo(weights.dtype).tiny),
                       torch.zeros_like(weights))


def gated(weight: float, knn, nearest_cosine: torch.Tensor | None, lm_log_probs: torch.Tensor):
    """kNN-LM's lambda per row [..., 1] under knn.gate_cosine and knn.gate_entropy (the product of
    the two factors that are on), or `weight` itself with both gates off.

    A lambda that follows the neighbours' distance (He et al. 2021, Drozdov et al. 2022) or the
    model's uncertainty, so text far from the datastore (general text) keeps the model's own
    distribution: with gate_cosine c0 the factor is (cos_1 - c0) / (1 - c0) clipped to [0, 1],
    cos_1 the nearest key's cosine; with gate_entropy H0 it is min(1, H / H0), H the model's
    next-token entropy in nats.

    >>> from types import SimpleNamespace as K
    >>> lm = torch.log(torch.tensor([[0.5, 0.5], [0.9, 0.1]]))
    >>> gated(0.5, K(gate_cosine=0.5, gate_entropy=0.0), torch.tensor([0.75, 0.25]), lm).flatten().tolist()
    [0.25, 0.0]
    >>> [round(x, 4) for x in gated(0.4, K(gate_cosine=0.0, gate_entropy=1.0), None, lm).flatten().tolist()]
    [0.2773, 0.13]
    """
    if not knn.gate_cosine and not knn.gate_entropy:
        return weight
    factor = torch.ones(lm_log_probs.shape[:-1] + (1,), device=lm_log_probs.device)
    if knn.gate_cosine and nearest_cosine is None:  # no key to be near (an empty store): no vote
        return 0.0
    if knn.gate_cosine:
        factor = factor * ((nearest_cosine.float() - knn.gate_cosine) / (1 - knn.gate_cosine)
                           ).clamp(0, 1).reshape(factor.shape)
    if knn.gate_entropy:
        entropy = torch.special.entr(lm_log_probs.float().exp()).sum(-1, keepdim=True)  # 0 log 0 = 0
        factor = factor * (entropy / knn.gate_entropy).clamp(max=1)
    return weight * factor


def mix_votes(lm_log_probs: torch.Tensor,
              votes: list[tuple[float, torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """`mix` with each part given as its votes: (lambda, token ids [..., n], vote_weights [..., n]);
    a lambda is a number or a tensor [..., 1] of one per row (`gated`).

    The same distribution as `mix` on the dense parts (tests/test_knn.py), at the cost of one pass
    over the vocabulary instead of several: only the k + window voted tokens of a row differ from
    the model's (weighted) log-probability, so only they are recomputed. What evaluate and
    `rarelm generate` run (rarelm.knn.hook).
    """
    votes = [(lam, ids, w) for lam, ids, w in votes
             if (torch.is_tensor(lam) or lam > 0) and ids.shape[-1] > 0]
    if not votes:
        return lm_log_probs
    lm = lm_log_probs.float()
    extra = torch.zeros_like(lm)
    lm_weight = torch.ones(lm.shape[:-1] + (1,), device=lm.device)
    for lam, ids, w in votes:
        share = lam * (w.sum(-1, keepdim=True) > 0)  # a part with no vote in a row gives its lambda back
        lm_weight = lm_weight - share
        extra.scatter_add_(-1, ids.long(), share * w)
    ids = torch.cat([v[1].long() for v in votes], -1)
    log_weight = lm_weight.log()
    out = lm + log_weight
    at = torch.logaddexp(lm.gather(-1, ids) + log_weight, extra.gather(-1, ids).log())
    return out.scatter_(-1, ids, at)


def vote_log_probs(scores: torch.Tensor, values: torch.Tensor, vocab: int,
                   valid: torch.Tensor | None = None) -> torch.Tensor:
    """log of softmax(scores) summed per value token: [..., vocab] float32 (-inf where no vote).

    `scores` [..., n] (already divided by the temperature), `values` [..., n] token ids,
    `valid` [..., n] bool (False = not a candidate). A row with no valid candidate comes out
    all -inf; the caller gives its weight to the model (`mix`).

    >>> vote_log_probs(torch.tensor([[0.0, 0.0]]), torch.tensor([[2, 2]]), 3).exp().tolist()
    [[0.0, 0.0, 1.0]]
    """
    weights = vote_weights(scores, valid)
    probs = torch.zeros((*scores.shape[:-1], vocab), dtype=torch.float32, device=scores.device)
    probs.scatter_add_(-1, values.long(), weights)
    return probs.log()


def knn_log_probs(distances: torch.Tensor, values: torch.Tensor, vocab: int, temperature: float,
                  valid: torch.Tensor | None = None) -> torch.Tensor:
    """p_kNN as log-probabilities [n, vocab] from the k nearest neighbours' squared L2 distances and
    values ([n, k] each)."""
    return vote_log_probs(-distances / temperature, values, vocab, valid)


def similarity(queries: torch.Tensor, history: torch.Tensor, kind: str = "dot") -> torch.Tensor:
    """[..., T, L] similarities of queries [..., T, d] to the history's states [..., L, d], float32:
    dot products, or (kind "cosine") cosines, which no hidden width or norm scales.

    >>> q, h = torch.tensor([[[3.0, 4.0]]]), torch.tensor([[[6.0, 8.0], [4.0, -3.0]]])
    >>> similarity(q, h).tolist(), similarity(q, h, "cosine").tolist()
    ([[[50.0, 0.0]]], [[[1.0, 0.0]]])
    """
    queries, history = queries.float(), history.float()
    if kind == "cosine":
        queries, history = F.normalize(queries, dim=-1), F.normalize(history, dim=-1)
    return torch.einsum("...td,...ld->...tl", queries, history)


def cache_log_probs(queries: torch.Tensor, history: torch.Tensor, next_tokens: torch.Tensor,
                    visible: torch.Tensor, vocab: int, temperature: float, kind: str = "dot") -> torch.Tensor:
    """p_cache as log-probabilities [..., vocab]: `queries` [..., d], the history's hidden states
    [..., L, d], the token that followed each [..., L], which of them each query may see [..., L];
    `kind` the similarity (`similarity`)."""
    scores = similarity(queries.unsqueeze(-2), history, kind).squeeze(-2) / temperature
    return vote_log_probs(scores, next_tokens, vocab, visible)


def mix(lm_log_probs: torch.Tensor, lam_knn: float = 0.0, knn: torch.Tensor | None = None,
        lam_cache: float = 0.0, cache: torch.Tensor | None = None) -> torch.Tensor:
    """log p of the interpolation (module docstring), rows [..., vocab], float32.

    `lm_log_probs` must be normalised log-probabilities. A part that is None, or a row of it that
    is all -inf (nothing to vote with), hands its weight to the model. With both weights 0 the
    model's log-probabilities come back unchanged, the same tensor.
    """
    if (lam_knn == 0 or knn is None) and (lam_cache == 0 or cache is None):
        return lm_log_probs
    lm = lm_log_probs.float()
    shape = lm.shape[:-1] + (1,)
    parts, weights = [], []
    for lam, part in ((lam_knn, knn), (lam_cache, cache)):
        if lam == 0 or part is None:
            continue
        has = torch.isfinite(part.amax(-1, keepdim=True))  # the part voted in this row
        weights.append(torch.where(has, torch.full(shape, lam, device=lm.device),
                                   torch.zeros(shape, device=lm.device)))
        parts.append(part)
    lm_weight = 1.0 - sum(weights)
    terms = [lm + lm_weight.log()] + [p + w.log() for p, w in zip(parts, weights, strict=True)]
    # -inf + log 0 stays -inf; a row where a part did not vote adds exp(-inf) = 0 of it
    return torch.logsumexp(torch.stack(terms), dim=0)
