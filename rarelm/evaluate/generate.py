"""`rarelm generate`: continue a prompt with a model folder, printing tokens as they come.

    rarelm generate "The patient presented with" --max-tokens 40
    rarelm generate "心肌梗死的" --model models/model --greedy
    rarelm generate "Acute" --temperature 0.7 --top-k 40 --top-p 0.9 --seed 3
    rarelm generate "Acute" --greedy --logit-adjust 0.5      # lift tokens rare in train

Greedy (`--greedy`) always gives the same text; sampling (temperature, top-k,
top-p) gives the same text for the same `--seed`. Generation stops at the
model's end-of-text token or after `--max-tokens`. A prompt that does not fit in
the model's context beside `--max-tokens` new tokens keeps its last tokens (one
warning line). Any local causal LM folder with its tokenizer works; a bad folder
or option is one line on stderr.

`--logit-adjust TAU` decodes with post-hoc logit adjustment, `logits - TAU * log pi`
(pi: the train unigram prior from the rare_terms stage's counts.npy, `--counts`),
before the argmax or the sampling: one add of a [V] vector per step.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch
from transformers import GenerationConfig, TextStreamer

from rarelm import paths
from rarelm.artifacts.buckets import log_prior
from rarelm.errors import RarelmError
from rarelm.evaluate.decoding import context_length, generate_raw, logit_adjustment, logit_bias_processor
from rarelm.evaluate.model_folder import load_causal_lm, load_model_tokenizer
from rarelm.files import load_array
from rarelm.fmt import printable


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How to pick each next token; greedy ignores the rest."""

    max_tokens: int = 100
    greedy: bool = False
    temperature: float = 0.8
    top_k: int = 50  # 0 = no top-k cut
    top_p: float = 0.95  # 1 = no nucleus cut
    seed: int = 0
    logit_adjust: float = 0.0  # tau of post-hoc logit adjustment; 0 = off

    def __post_init__(self) -> None:
        # Upper bounds too: a temperature of 1e-45 made every logit infinite (a 108-line traceback),
        # a seed past 64 bits an OverflowError in torch.
        checks = [("--max-tokens", self.max_tokens, 1 <= self.max_tokens <= 1_000_000, "in 1..1000000"),
                  ("--temperature", self.temperature, 1e-3 <= self.temperature <= 1e3,
                   "in [0.001, 1000]; --greedy takes the likeliest token"),
                  ("--top-k", self.top_k, 0 <= self.top_k <= 10_000_000, "in 0..10000000 (0 = off)"),
                  ("--top-p", self.top_p, 0 < self.top_p <= 1, "in (0, 1]"),
                  ("--seed", self.seed, 0 <= self.seed <= 2**32 - 1, "in 0..4294967295"),
                  ("--logit-adjust", self.logit_adjust, 0 <= self.logit_adjust <= 100,
                   "in [0, 100] (0 = off)")]
        for name, value, ok, allowed in checks:
            if not ok:
                raise RarelmError(f"{name} = {value} is not allowed (must be {allowed})")


class Streamer(TextStreamer):
    """TextStreamer that writes to `out` (flushed per piece) instead of print()."""

    def __init__(self, tokenizer, out: TextIO):
        super().__init__(tokenizer, skip_prompt=True, skip_special_tokens=True)
        self.out = out

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        self.out.write(text + ("\n" if stream_end else ""))
        self.out.flush()


def load_log_prior(path: str | Path, tokenizer) -> np.ndarray:
    """log pi from a counts.npy (rare_terms stage), checked against the tokenizer's vocabulary."""
    path = Path(path)
    if not path.is_file():
        raise RarelmError(f"{path}: no such counts file (--logit-adjust needs the train token counts "
                          "of the rare_terms stage; give their path with --counts)")
    counts = load_array(path, np.int64, len(tokenizer), "rare_terms",
                        "for this model's tokenizer; it does not match the vocabulary")
    return log_prior(counts)


def generate(model, tokenizer, prompt: str, sampling: Sampling, out: TextIO | None = None,
             log_prior: np.ndarray | None = None) -> list[int]:
    """Continue `prompt`, streaming the text to `out` (if given); returns the new token ids.

    `log_prior` (load_log_prior) is needed when sampling.logit_adjust > 0.
    """
    empty = torch.zeros((1, 0), dtype=torch.long)
    ids = tokenizer(prompt, return_tensors="pt").input_ids if prompt else empty
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    if ids.shape[1] == 0:  # an empty prompt starts a fresh document
        if start is None:
            raise RarelmError("the prompt is empty and the tokenizer has no bos/eos token to start from")
        ids = torch.tensor([[start]])
    ids = fit_context(ids, sampling.max_tokens, context_length(model))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if sampling.greedy:
        config = GenerationConfig(do_sample=False, max_new_tokens=sampling.max_tokens, pad_token_id=pad)
    else:
        config = GenerationConfig(do_sample=True, max_new_tokens=sampling.max_tokens, pad_token_id=pad,
                                  temperature=sampling.temperature, top_k=sampling.top_k,
                                  top_p=sampling.top_p)
    extra = {}
    if sampling.logit_adjust:
        if log_prior is None:
            raise ValueError("--logit-adjust > 0 needs the train log prior")
        bias = logit_adjustment(model, log_prior, sampling.logit_adjust)
        extra["logits_processor"] = logit_bias_processor(bias)
    torch.manual_seed(sampling.seed)
    ids = ids.to(model.device)
    output = generate_raw(model, ids, torch.ones_like(ids), config,
                          streamer=Streamer(tokenizer, out) if out is not None else None, **extra)
    return output[0, ids.shape[1]:].tolist()


def fit_context(ids, max_tokens: int, limit: int | None, err: TextIO | None = None):
    """The prompt ids [1, n] cut from the left to fit the context beside `max_tokens` new ones.

    A cut prints one warning line; `max_tokens` alone filling the context is an error.
    A context of 8 with 3 new tokens keeps the prompt's last 5 ids:

    >>> import io, torch
    >>> fit_context(torch.arange(7)[None], 3, 8, err=io.StringIO()).tolist()
    [[2, 3, 4, 5, 6]]
    """
    if not limit or ids.shape[1] + max_tokens <= limit:
        return ids
    if max_tokens >= limit:
        raise RarelmError(f"--max-tokens {max_tokens} leaves no room for the prompt in the model's "
                          f"context of {limit} tokens (must be < {limit})")
    keep = limit - max_tokens
    print(f"rarelm generate: warning: the prompt ({ids.shape[1]} tokens) plus --max-tokens {max_tokens} "
          f"exceeds the model's context of {limit} tokens: keeping the prompt's last {keep} tokens",
          file=err or sys.stderr, flush=True)
    return ids[:, -keep:]


@dataclasses.dataclass(frozen=True)
class Mixing:
    """What changes the model's next-token distribution beside `Sampling`: the train token counts
    behind `Sampling.logit_adjust` (the rare_terms stage's counts.npy), and kNN-LM and the cache
    (`knn`: params.knn, None = off) with the datastore folder they search."""

    counts: str | Path = f"{paths.RARE}/counts.npy"
    knn: Any = None
    datastore: str | Path = paths.DATASTORE


def run(model_dir: str | Path, prompt: str, sampling: Sampling, device: str = "auto",
        mixing: Mixing = Mixing(), out: TextIO = sys.stdout) -> list[int]:
    """What the CLI does: load the folder (and the counts, with --logit-adjust), echo the prompt,
    stream the continuation.

    With kNN-LM or the cache on (`mixing.knn`), the datastore folder is opened and mixed into every
    step's distribution (rarelm/knn/hook.py), and one line on stderr says so.
    """
    from rarelm.knn.datastore import Datastore  # on use: only with knn on
    from rarelm.knn.hook import active, attached, describe, uses_store

    model = load_causal_lm(model_dir, device)
    tokenizer = load_model_tokenizer(model_dir)
    prior = load_log_prior(mixing.counts, tokenizer) if sampling.logit_adjust else None
    knn = mixing.knn
    on = knn is not None and active(knn)
    store = Datastore.open(mixing.datastore, str(model.device), knn.nprobe) if on and uses_store(knn) \
        else None
    if on:
        print(f"rarelm generate: mixing in {describe(knn, store)}", file=sys.stderr, flush=True)
    out.write(printable(prompt))  # a pasted escape sequence must not drive the terminal
    out.flush()
    with attached(model, store, knn if on else _Off(), tokenizer.eos_token_id):
        return generate(model, tokenizer, prompt, sampling, out, prior)


class _Off:
    """knn params that attach nothing."""

    enabled, weight, cache_weight, cache_window = False, 0.0, 0.0, 0
