"""kNN-LM and the continuous cache plugged into a model's output layer: the one place where every
next-token distribution of `evaluate` and `rarelm generate` is made.

    with attached(model, store, params.knn, eot_id):
        ...  # score_tokens, continuation_scores, greedy_continue, model.generate, ...

While attached, the output layer returns log p of the interpolation (rarelm.knn.interpolate)
instead of logits. A log-probability vector is a valid logit vector (log_softmax leaves it as
it is), so perplexity, term NLL, ranks, greedy and sampled decoding all read the mixed
distribution with no change of their own; a logit bias (eval.logit_adjust_tau) is added after
the mix. With kNN-LM and the cache both off (knn.enabled false, knn.cache_weight or
knn.cache_window 0) nothing is attached: the model is the model, bit for bit.

Two hooks: one on the base model (before the output layer) records the forward's input ids,
attention mask and every position's final hidden state (the cache needs the history, which
`logits_to_keep` hides from the output layer); one on the output layer mixes at the positions
it scores. History is per row, linear: a forward without a KV cache starts it, a forward with
one (generation) appends to it. A forward that is not a continuation of the same rows (a tree
attention mask, or rows re-selected from the KV cache: the closed-set scoring of candidate
terms) sees the history of its prompt alone, not the candidate's own earlier tokens.

The history of position t is positions t - cache_window .. t - 1 of the same document: no
end-of-text token in between, padding (attention mask 0) left out.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch

from rarelm.errors import RarelmError
from rarelm.knn.interpolate import gated, mix_votes, similarity, vote_weights


@dataclasses.dataclass
class _History:
    hidden: torch.Tensor  # [B, L, d] final hidden states
    ids: torch.Tensor  # [B, L] the input token at each position
    mask: torch.Tensor  # [B, L] bool: a real token (not padding)


class Interpolation:
    """The state and settings of one attached model (see `attached`)."""

    def __init__(self, store, knn, eot_id: int | None):
        self.store, self.knn, self.eot_id = store, knn, eot_id
        self.history: _History | None = None  # the positions before this forward, per row
        self.frozen: _History | None = None  # a prompt's history, while candidates branch off it
        self.current: _History | None = None  # this forward: history + its own positions
        self.new = 0  # positions this forward added at the end of `current`
        self._pending = None

    @property
    def uses_knn(self) -> bool:
        return self.store is not None and uses_store(self.knn) and self.knn.k > 0 and len(self.store) > 0

    @property
    def uses_cache(self) -> bool:
        return uses_cache(self.knn)

    # -- hook on the base model: what this forward holds ----------------------------------------
    def before_base(self, _module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        mask = kwargs.get("attention_mask")
        past = kwargs.get("cache", kwargs.get("past_key_values"))
        past_len = past.get_seq_length() if past is not None and hasattr(past, "get_seq_length") else 0
        self._pending = (ids, mask, past_len)

    def after_base(self, _module, _args, _kwargs, output):
        ids, mask, past_len = self._pending
        hidden = output[0] if isinstance(output, tuple) else output.last_hidden_state
        batch, width = ids.shape
        tree = mask is not None and mask.dim() == 4
        if mask is None or tree:
            new_mask = torch.ones((batch, width), dtype=torch.bool, device=ids.device)
        else:
            new_mask = mask[:, -width:].bool()
        new = _History(hidden.detach(), ids, new_mask)
        if past_len == 0:  # a fresh sequence
            self.history, self.frozen = None, None
            self.current = new
        elif tree or self.frozen is not None or self.history is None or len(self.history.ids) != batch:
            # not a plain continuation of the rows: candidates branching off one prompt
            if self.frozen is None:
                self.frozen = self.history
            prompt = self.frozen
            if prompt is not None and len(prompt.ids) == 1 and batch > 1:
                prompt = _History(*(x.expand(batch, *x.shape[1:]) for x in dataclasses.astuple(prompt)))
            self.current = _join(prompt, new) if prompt is not None and len(prompt.ids) == batch else new
        else:
            self.current = _join(self.history, new)
        self.new = width
        if self.frozen is None:  # keep what the next forward's cache may still see
            keep = max(self.knn.cache_window, 1)
            c = self.current
            self.history = _History(c.hidden[:, -keep:], c.ids[:, -keep:], c.mask[:, -keep:])

    # -- hook on the output layer: the mixed distribution -----------------------------------------
    def after_head(self, _module, args, logits):
        queries = args[0]  # [B, T', d]: the positions scored (logits_to_keep may drop earlier ones)
        lm = torch.log_softmax(logits.float(), dim=-1)
        votes = []
        if self.uses_knn:
            distances, values = self.store.search(queries.reshape(-1, queries.shape[-1]), self.knn.k)
            shape = lm.shape[:-1] + (values.shape[-1],)
            # cosine store: the distance is 2 - 2 cos, so the score is cos / T, as the cache's
            cosine = self.store.similarity == "cosine"
            similarities = 1 - distances / 2 if cosine else -distances
            # the gate's cos_1 (params: cosine stores only); an empty store has no nearest key
            nearest = similarities.amax(-1) if cosine and similarities.shape[-1] else None
            lam = gated(self.knn.weight, self.knn, nearest, lm)
            votes.append((lam, values.reshape(shape),
                          vote_weights(similarities / self.knn.temperature).reshape(shape)))
        if self.uses_cache and self.current is not None:
            votes.append((self.knn.cache_weight, *self._cache(queries)))
        return mix_votes(lm, votes)

    def _cache(self, queries: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The cache's votes at the scored positions: (next token ids, weights), [B, T', history] each."""
        c = self.current
        total, scored = c.ids.shape[1], queries.shape[1]
        positions = torch.arange(total - scored, total, device=c.ids.device)  # the scored positions
        index = torch.arange(total, device=c.ids.device)
        # the token after history position i is the input at i + 1 (the last has none yet)
        next_ids = torch.cat([c.ids[:, 1:], c.ids[:, -1:]], 1)
        # a candidate token (tree or re-selected rows) counts as the first after its prompt
        at = torch.full_like(positions, total - self.new) if self.frozen is not None else positions
        earlier = (index[None] < at[:, None]) & (at[:, None] - index[None] <= self.knn.cache_window)
        # same document: no end-of-text token at positions i .. t - 1
        eot = (c.ids == self.eot_id) & c.mask if self.eot_id is not None else torch.zeros_like(c.mask)
        seen = torch.cumsum(eot.long(), 1)  # eot tokens at positions <= i
        before = torch.cat([torch.zeros_like(seen[:, :1]), seen[:, :-1]], 1)  # at positions < i
        same_doc = before[:, None, :] == before[:, at][:, :, None]
        visible = earlier[None] & same_doc & c.mask[:, None, :] & c.mask[:, positions][:, :, None]
        scores = similarity(queries, c.hidden, self.knn.cache_similarity) / self.knn.cache_temperature
        return next_ids[:, None].expand(-1, scored, -1), vote_weights(scores, visible)


def _join(a: _History | None, b: _History) -> _History:
    if a is None:
        return b
    return _History(torch.cat([a.hidden, b.hidden], 1), torch.cat([a.ids, b.ids], 1),
                    torch.cat([a.mask, b.mask], 1))


def uses_store(knn) -> bool:
    """Whether kNN-LM is on: the datastore is built, opened and mixed in."""
    return bool(knn.enabled) and knn.weight > 0


def uses_cache(knn) -> bool:
    """Whether the continuous cache is on (it needs no datastore)."""
    return knn.cache_weight > 0 and knn.cache_window > 0


def active(knn) -> bool:
    """Whether the knn params change the distribution at all: kNN-LM or the cache on."""
    return uses_store(knn) or uses_cache(knn)


@contextlib.contextmanager
def attached(model, store, knn, eot_id: int | None) -> Iterator[Interpolation | None]:
    """Mix kNN-LM and the cache into `model`'s next-token distribution inside the block (module
    docstring); nothing attached (yields None) when `active(knn)` is false."""
    if not active(knn):
        yield None
        return
    width = model.get_output_embeddings().weight.shape[1]
    if store is not None and len(store) and store.hidden != width:
        raise RarelmError(f"the datastore's keys have {store.hidden} dimensions, the model's hidden states "
                          f"{width}: it was built with another model; re-run the datastore stage")
    if store is not None and uses_store(knn) and store.similarity != knn.similarity:
        raise RarelmError(f"the datastore was built for knn.similarity = {store.similarity}, the params say "
                          f"{knn.similarity}: re-run the datastore stage")
    state = Interpolation(store, knn, eot_id)
    handles = [model.base_model.register_forward_pre_hook(state.before_base, with_kwargs=True),
               model.base_model.register_forward_hook(state.after_base, with_kwargs=True),
               model.get_output_embeddings().register_forward_hook(state.after_head)]
    try:
        yield state
    finally:
        for handle in handles:
            handle.remove()


def describe(knn, store) -> str:
    """One line for stderr: what is mixed in."""
    parts = []
    if uses_store(knn):
        cosine = "cosine similarity, " if knn.similarity == "cosine" else ""
        gates = (f", gated from cosine {knn.gate_cosine:g}" if knn.gate_cosine else "") + \
            (f", gated by entropy over {knn.gate_entropy:g} nats" if knn.gate_entropy else "")
        parts.append(f"kNN-LM over {len(store) if store is not None else 0:,} datastore entries "
                     f"(k {knn.k}, lambda {knn.weight:g}, {cosine}T {knn.temperature:g}{gates})")
    if uses_cache(knn):
        cosine = "cosine similarity, " if knn.cache_similarity == "cosine" else ""
        parts.append(f"continuous cache (window {knn.cache_window}, lambda {knn.cache_weight:g}, "
                     f"{cosine}T {knn.cache_temperature:g})")
    return " + ".join(parts) if parts else "kNN-LM and cache off"

