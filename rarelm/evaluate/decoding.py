"""Batched decoding of a causal LM, shared by `evaluate` and `rarelm generate`.

Prompts of different lengths are decoded together: left-padded with an
attention mask, so every row continues from its own last token, and through
`model.generate`, which keeps the KV cache and the position ids right for
whatever architecture the model holds:

    model = load_causal_lm("models/model")          # rarelm.evaluate.model_folder
    greedy_continue(model, [[5, 6, 7], [9]], n_new=2, pad_id=0)   # tensor of shape [2, 2]

Generation never stops early at the end-of-text token (`eos_token_id=[]`):
every row gets exactly `n_new` tokens, so rows stay comparable.

Post-hoc logit adjustment (Menon et al., ICLR 2021) is one [V] vector added to
every next-token logit, `logit_bias = -tau * log pi` with pi the train unigram
prior (`logit_adjustment`); each function here and in rarelm.evaluate.scoring
takes it as `logit_bias` (None = the model as trained, and the code path of an
unadjusted model).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from rarelm.errors import RarelmError


def context_length(model) -> int | None:
    """The most positions the model can attend to, or None if its config does not say."""
    config = model.config
    for name in ("n_positions", "max_position_embeddings", "n_ctx", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def logit_adjustment(model, log_prior, tau: float):
    """`-tau * log_prior` as a float32 tensor as wide as the model's logits, on its device; None at tau 0.

    Subtracting tau * log pi lifts tokens the train split rarely had: with logits
    (2.0, 1.5) and train counts (99, 0), pi = (100, 1) / 101 (add-one, rare.log_prior),
    and tau = 0.5 gives (2.0 + 0.005, 1.5 + 2.308): the argmax moves to the second
    token. Ids past the prior (an embedding padded beyond the tokenizer) get 0, as
    if their prior were 1, so they are never lifted.
    """
    if tau == 0:
        return None
    log_prior = torch.as_tensor(log_prior, dtype=torch.float64)
    width = getattr(model.config, "vocab_size", None) or len(log_prior)
    if len(log_prior) > width:
        raise RarelmError(f"the prior covers {len(log_prior)} token ids, more than the model's "
                          f"vocabulary of {width}")
    bias = torch.zeros(width, dtype=torch.float64)
    bias[:len(log_prior)] = -tau * log_prior
    return bias.float().to(model.device)


class LogitBias(LogitsProcessor):
    """Adds `logit_bias` to the next-token scores; generate() runs it before temperature/top-k/top-p."""

    def __init__(self, logit_bias):
        self.logit_bias = logit_bias

    def __call__(self, input_ids, scores):
        return scores + self.logit_bias


def logit_bias_processor(logit_bias) -> LogitsProcessorList:
    """The processor list to pass to generate() as `logits_processor`: LogitBias alone."""
    return LogitsProcessorList([LogitBias(logit_bias)])


def left_pad(prompts: list[list[int]], pad_id: int, device="cpu"):
    """(input ids, attention mask) with every prompt right-aligned.

    >>> ids, mask = left_pad([[5, 6, 7], [9]], pad_id=0)
    >>> ids.tolist(), mask.tolist()
    ([[5, 6, 7], [0, 0, 9]], [[1, 1, 1], [0, 0, 1]])
    """
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.as_tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt):] = 1
    return ids.to(device), mask.to(device)


_CONSTRAINTS: list[LogitsProcessor] = []  # what `constrained` blocks add to every decode below


@contextlib.contextmanager
def constrained(processor: LogitsProcessor) -> Iterator[None]:
    """A block in which every greedy_continue / sample_continue runs `processor` after the logit
    bias (rarelm.evaluate.term_trie: term-trie decoding); teacher-forced scoring is untouched."""
    _CONSTRAINTS.append(processor)
    try:
        yield
    finally:
        _CONSTRAINTS.remove(processor)


def _steering(prompts: list[list[int]], logit_bias, own: list[int] | None) -> dict:
    """generate()'s `logits_processor` argument for one batched decode: the logit bias, then the
    `constrained` processors; one that asks (the term trie) learns where each row's own tokens
    begin: the last own[r] of its prompt (given as if the model had written them), then what it
    writes."""
    width = max(map(len, prompts))  # left_pad's
    starts = [width - n for n in (own or [0] * len(prompts))]
    processors = ([] if logit_bias is None else [LogitBias(logit_bias)]) + \
        [c.bound(starts) if hasattr(c, "bound") else c for c in _CONSTRAINTS]
    return {"logits_processor": LogitsProcessorList(processors)} if processors else {}


def _continue(model, prompts: list[list[int]], n_new: int, pad_id: int, steering: dict, **sampling):
    ids, mask = left_pad(prompts, pad_id, model.device)
    config = GenerationConfig(max_new_tokens=n_new, eos_token_id=[], pad_token_id=pad_id, **sampling)
    return generate_raw(model, ids, mask, config, **steering)[:, ids.shape[1]:].cpu()


def generate_raw(model, ids, mask, config: GenerationConfig, **extra):
    """model.generate(...) without gradients, decided by `config` (and `extra`) alone.

    generate() fills unset fields from the folder's generation_config.json (sampling on,
    repetition penalty, no-repeat n-grams, ...): a blank one stands in while it runs, so the
    raw model is measured, then the folder's is put back.
    """
    shipped, model.generation_config = model.generation_config, GenerationConfig()
    try:
        with torch.no_grad():
            return model.generate(ids, attention_mask=mask, generation_config=config, **extra)
    finally:
        model.generation_config = shipped


def greedy_continue(model, prompts: list[list[int]], n_new: int, pad_id: int, logit_bias=None,
                    own: list[int] | None = None):
    """Greedy continuations, LongTensor [len(prompts), n_new], one batched decode with the KV cache.
    `own[r]`: how many of prompt r's last tokens count as the model's own for a `constrained` term
    trie (a term it began); none by default."""
    return _continue(model, prompts, n_new, pad_id, _steering(prompts, logit_bias, own), do_sample=False)


def sample_continue(model, prompts: list[list[int]], n_new: int, pad_id: int, logit_bias=None):
    """Continuations [len(prompts), n_new] sampled at temperature 1 with no top-k or top-p cut (the
    model's own distribution); seed torch's global RNG first for repeatability."""
    return _continue(model, prompts, n_new, pad_id, _steering(prompts, logit_bias, None), do_sample=True,
                     temperature=1.0, top_k=0, top_p=1.0)
