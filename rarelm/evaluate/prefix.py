"""What stands before every scored window, term prompt and sampled continuation: the model's lead (the
tokens its tokenizer puts first in any text: `<bos>` for Gemma 3, nothing for GPT-2-style tokenizers
such as SmolLM2's or the pipeline's own BPE), then the train passages that retrieval.* finds.

A model trained with `<bos>` first in every sequence reads a window that starts without it as broken
text: Gemma 3's val windows of manpages_zh score perplexity 355 cold and 64 led by `<bos>`
(bench/gemma_bos.py, docs/results.md). The tokenize stage writes documents and end-of-text tokens
only, so evaluate puts the lead back here, as context that is never scored (the train stage reads it
before its windows too: rarelm/train/batches.py `logits_after_lead`):

    with leading([2]), retrieving(retriever):
        prefixes([before])  # [[2, <passages found for `before`>..., <eot>]]
        width()             # 1 + retriever.width: every prefix is this long
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from rarelm.errors import RarelmError
from rarelm.evaluate import retrieval

_LEADS: list[list[int]] = []


@contextlib.contextmanager
def leading(ids: Sequence[int]) -> Iterator[None]:
    """A block in which every window and prompt starts with `ids` (empty: nothing, the block as it is)."""
    _LEADS.append([int(t) for t in ids])
    try:
        yield
    finally:
        _LEADS.pop()


def lead() -> list[int]:
    """The tokens of the innermost `leading` block ([] outside any)."""
    return list(_LEADS[-1]) if _LEADS else []


def width() -> int:
    """Tokens put before every window and prompt now: the lead, then retrieval's passages."""
    return len(lead()) + retrieval.width()


def prefixes(befores: list) -> list[list[int]]:
    """The `width()` tokens to put before each prompt or window whose preceding tokens are `befores`.

    >>> with leading([2]):
    ...     prefixes([[5, 6], [7]])
    [[2], [2]]
    >>> prefixes([[5, 6]])
    [[]]
    """
    retriever = retrieval.active()
    found = retriever.prefixes(befores) if retriever is not None else [[] for _ in befores]
    head = lead()
    return [head + p for p in found]


def window(block_size: int, limit: int | None, lead_tokens: int | None = None) -> int:
    """The targets of a scored window: eval.block_size, or with 0 the model's context of `limit`
    positions less the lead before it (`lead_tokens`, else the active block's), 1,024 where the
    context is unknown.

    >>> window(0, 512, 1), window(128, 512, 1), window(0, None, 1)
    (511, 128, 1024)

    A window that does not fit with its lead is a one-line error (evaluate and the datastore stage):

    >>> window(512, 512, 1)
    Traceback (most recent call last):
    rarelm.errors.RarelmError: params: eval.block_size = 512 is not allowed (must be <= the model's \
context length 512 less the 1 lead token(s) before every window)
    """
    before = len(lead()) if lead_tokens is None else lead_tokens
    block = block_size or (limit - before if limit else 1024)
    if limit and block + before > limit:
        raise RarelmError(f"params: eval.block_size = {block} is not allowed "
                          f"(must be <= the model's context length {limit}"
                          f"{f' less the {before} lead token(s) before every window' if before else ''})")
    return block
