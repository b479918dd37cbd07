"""What every measurement of the `evaluate` stage shares: the evaluation's context (`EvalContext`), the
split it measures (`SplitText`), the progress callback and a safe ratio."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rarelm.params import EvalParams

# progress("what", total) -> advance(n); None = silent
Progress = Callable[[str, int], Callable[[int], None]]


@dataclasses.dataclass(frozen=True)
class EvalContext:
    """What every measurement of one evaluation reads, built once (rarelm/evaluate/stage.py) and passed down.

        ctx = EvalContext(model, tokenizer, eot_id=0, params=EvalParams(batch_size=8))
        score_tokens(ctx, tokens, buckets, block_size=128)

    Decode-time mixing that changes the model itself stays in the block the stage opens around the
    measurements: kNN-LM and the cache hooked into the model (rarelm/knn/hook.py), the lead and the
    retrieved passages before every window and prompt (prefix.py), term-trie decoding
    (decoding.constrained).
    """

    model: Any  # a Hugging Face causal LM, on its device
    tokenizer: Any  # the data's `tokenizers.Tokenizer` (None where only token ids are scored)
    eot_id: int  # end-of-text: a document's first prompt, and the padding of batched decodes
    # the eval section: batch size, prompt and sample sizes, the term cap, the token budget, ...
    params: EvalParams = dataclasses.field(default_factory=EvalParams)
    seed: int = 0  # torch's RNG is seeded with it before each set of sampled continuations
    # added to every next-token logit (decoding.logit_adjustment); None = the model as trained
    logit_bias: Any = None
    progress: Progress | None = None  # None = silent

    def advance(self, description: str, total: int) -> Callable[[int], None]:
        """The progress callback's advance(n) for `total` steps of `description` (silent without one)."""
        return (self.progress or silent)(description, total)


@dataclasses.dataclass(frozen=True)
class SplitText:
    """One split as the tokenize stage lays it out: its token ids (each document followed by the
    end-of-text token), where each document starts in them (`offsets`, one more than documents: the
    last is the end) and the documents' prepared text, where term occurrences are searched."""

    name: str  # train, val or test: each occurrence row says it
    tokens: np.ndarray
    offsets: np.ndarray
    documents: Sequence[str] = ()  # () = ids only: no term search, no per-character figures


def silent(description: str, total: int) -> Callable[[int], None]:
    """The progress callback that shows nothing."""
    return lambda n: None


def ratio(num: float, den: float) -> float | None:
    """num / den, or None when there is nothing to divide by.

    >>> ratio(3, 4), ratio(1, 0)
    (0.75, None)
    """
    return None if den == 0 else num / den
