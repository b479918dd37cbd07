"""In-context retrieval (retrieval.*; Ram et al. 2023, In-Context RALM): before the model scores or
writes at a position, passages of the train split that BM25 finds for the text just before it are
put in front of the prompt, so a term the document has not mentioned yet may stand in the context.

The train split's tokens are cut into passages of `passage_tokens`; each passage's text is cut into
words (jieba for Chinese, lower-cased word characters otherwise) and indexed with BM25 (the `bm25s`
package). The query is the text of the last `query_tokens` tokens before the position; the
`passages` best passages, best last (nearest the prompt), and one end-of-text token go before it.
With `random` (the control) as many passages are drawn at random instead, the query ignored: what
in-domain text in front does by itself, beside what the right passage does.

With `dense` the passages are found by the model's own states instead of BM25
(rarelm.knn.datastore.NearestStates):
the query is the model's final hidden state after the last `query_tokens` tokens (its lead first),
searched among the datastore's keys (the state after each train token; rarelm/knn/datastore.py,
built by the datastore stage), and each of the `passages` nearest gives the `passage_tokens` train
tokens that followed it: what came next where the model was last in a state like this one, the
term included where one came next (kNN-LM keeps only the next token). Hits closer than a passage
to a nearer one are skipped, so the passages differ.

    retriever = Retriever.build(ctx, train_tokens, "en", RetrievalParams(enabled=True))
    with retrieving(retriever):
        ...  # score_tokens' windows, term prompts and sampled continuations get their passages

Every prefix is exactly `retriever.width` tokens long (full passages only), so scored windows still
stack. The passages come from the train split, never from the scored document (val, test or general
text); for a window of the split, the query is the text before the window. What the model alone
gives is scored apart where it matters: `ppl_general_model` is scored before any of this.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import numpy as np

from rarelm.evaluate.common import EvalContext


def words(text: str, language: str) -> list[str]:
    """BM25's terms of a text: jieba's words for Chinese (punctuation and spaces left out), else the
    lower-cased runs of word characters.

    >>> words("The TCP/IP stack", "en"), words("删除临时文件，然后退出。", "zh")
    (['the', 'tcp', 'ip', 'stack'], ['删除', '临时文件', '然后', '退出'])
    """
    if language == "zh":
        import jieba  # ~1 s to load: on use

        return [w for w in jieba.lcut(text) if re.match(r"\w", w)]
    return re.findall(r"\w+", text.lower())


class Retriever:
    """BM25 over the train split's passages; `prefix(before)` the tokens to put before a prompt."""

    def __init__(self, passages: np.ndarray, ctx: EvalContext, language: str, params, index=None,
                 states=None):
        self.passages, self.index, self.tokenizer = passages, index, ctx.tokenizer
        self.language, self.params, self.eot_id = language, params, ctx.eot_id
        self.width = passages_width(params)
        self.rng = np.random.default_rng(ctx.seed)  # retrieval.random: the control's draws
        self.states = states  # retrieval.dense: rarelm.knn.datastore.NearestStates

    @classmethod
    def build(cls, ctx: EvalContext, train_tokens: np.ndarray, language: str, params,
              states=None) -> Retriever:
        """BM25 over the train split's passages, or with `params.random` the control, or with
        `params.dense` the search by the model's states (`states`: rarelm.knn.datastore.NearestStates).

        `ctx` gives the tokenizer, the end-of-text token and the seed of the control's draws (its
        model is not read: the dense search has its own, in `states`)."""
        n = len(train_tokens) // params.passage_tokens
        if params.max_passages:
            n = min(n, params.max_passages)
        if n < params.passages:
            from rarelm.errors import RarelmError

            raise RarelmError(f"the train split holds {n} passages of {params.passage_tokens} tokens, fewer "
                              f"than retrieval.passages = {params.passages}")
        passages = np.asarray(train_tokens[:n * params.passage_tokens], dtype=np.int64).reshape(n, -1)
        if getattr(params, "random", False):  # the control needs no index
            return cls(passages, ctx, language, params)
        if getattr(params, "dense", False):
            if states is None or len(states.store) < params.passages:
                from rarelm.errors import RarelmError

                raise RarelmError("retrieval.dense needs the datastore stage's store of the model, with at "
                                  f"least retrieval.passages = {params.passages} entries")
            return cls(passages, ctx, language, params, states=states)
        import bm25s  # on use

        texts = ctx.tokenizer.decode_batch(passages.tolist(), skip_special_tokens=True)
        index = bm25s.BM25()
        index.index([words(t, language) for t in texts], show_progress=False)
        return cls(passages, ctx, language, params, index)

    def prefix(self, before) -> list[int]:
        """The `width` tokens to put before a prompt whose preceding tokens are `before` (the last
        `query_tokens` of them are the query): the best passages, the best last, then end-of-text."""
        return self.prefixes([before])[0]

    def prefixes(self, befores: list) -> list[list[int]]:
        if self.states is not None:  # retrieval.dense
            starts = self.states.starts(befores, self.params, self.eot_id)
            p = self.params.passage_tokens
            return [[int(t) for s in row[::-1] for t in self.states.tokens[s:s + p]] + [self.eot_id]
                    for row in starts]
        if self.index is None:  # retrieval.random: distinct passages drawn for each, the query ignored
            n, k = len(self.passages), self.params.passages
            found = [self.rng.choice(n, k, replace=False) for _ in befores]
            return [[int(t) for i in row for t in self.passages[i]] + [self.eot_id] for row in found]
        # a query with no word (a window at the split's start) gets one no passage has: BM25 scores
        # every passage 0 and the first ones come back (the empty word is bm25s' own, refused here)
        queries = [words(self.tokenizer.decode([int(t) for t in b[-self.params.query_tokens:]],
                                               skip_special_tokens=True), self.language) or ["\x00"]
                   for b in befores]
        found, _ = self.index.retrieve(queries, k=self.params.passages, show_progress=False)
        return [[int(t) for i in row[::-1] for t in self.passages[i]] + [self.eot_id] for row in found]


def passages_width(params) -> int:
    """Tokens retrieval puts before every prompt and window: the passages, then one end-of-text.

    >>> from types import SimpleNamespace
    >>> passages_width(SimpleNamespace(passages=2, passage_tokens=31))
    63
    """
    return params.passages * params.passage_tokens + 1


def check_fits(block_size: int, width: int, limit: int | None) -> None:
    """A one-line error where a scored window and the `width` tokens before it (the model's lead and
    retrieved passages: rarelm/evaluate/prefix.py) exceed the model's context of `limit` positions
    (None: unknown, not checked)."""
    if limit and block_size + width > limit:
        from rarelm.errors import RarelmError

        raise RarelmError(f"eval.block_size {block_size} + the {width} tokens before it (lead and retrieved "
                          f"passages) exceed the model's context of {limit}: lower eval.block_size or "
                          "retrieval.passage_tokens")


_ACTIVE: list[Retriever] = []


@contextlib.contextmanager
def retrieving(retriever: Retriever | None) -> Iterator[None]:
    """A block in which `active()` is `retriever` (None: no retrieval, the block as it is)."""
    if retriever is None:
        yield
        return
    _ACTIVE.append(retriever)
    try:
        yield
    finally:
        _ACTIVE.remove(retriever)


def active() -> Retriever | None:
    """The retriever of the innermost `retrieving` block, or None."""
    return _ACTIVE[-1] if _ACTIVE else None


def width() -> int:
    """Tokens that retrieval puts before every prompt and window now (0 outside `retrieving`)."""
    return active().width if _ACTIVE else 0
