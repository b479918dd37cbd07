"""Loading a causal LM folder, and the batched decoding that `evaluate` and `generate` share.

Any local Hugging Face causal LM folder works (the pipeline's own GPT-2-style
model or a fine-tuned pretrained one); a bad folder is a one-line RarelmError.
Prompts of different lengths are decoded together: left-padded with an
attention mask, so every row continues from its own last token, and through
`model.generate`, which keeps the KV cache and the position ids right for
whatever architecture the folder holds:

    model = load_causal_lm("models/model")
    greedy_continue(model, [[5, 6, 7], [9]], n_new=2, pad_id=0)   # tensor of shape [2, 2]

Generation never stops early at the end-of-text token (`eos_token_id=[]`):
every row gets exactly `n_new` tokens, so rows stay comparable.

Post-hoc logit adjustment (Menon et al., ICLR 2021) is one [V] vector added to
every next-token logit, `logit_bias = -tau * log pi` with pi the train unigram
prior (`logit_adjustment`); each function below takes it as `logit_bias`
(None = the model as trained, and the code path of an unadjusted model).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rarelm.errors import RarelmError


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:200]


def load_causal_lm(path: str | Path, device: str = "cpu"):
    """The model in folder `path` (AutoModelForCausalLM), in eval mode on `device` (auto, cpu, cuda)."""
    path = Path(path)
    if not path.is_dir():
        raise RarelmError(f"{path}: no such model folder")
    if not (path / "config.json").is_file():
        raise RarelmError(f"{path}: no config.json, so not a Hugging Face model folder")
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()  # no "Loading weights" bar on stderr: a stage prints one line
    logging.set_verbosity_error()
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, config=config, local_files_only=True)
    except Exception as exc:  # transformers raises ValueError/OSError/KeyError/... for a bad folder
        raise RarelmError(f"{path}: not a loadable causal language model ({_first_line(exc)})") from None
    return model.to(resolve_device(device)).eval()


def load_tokenizer(path: str | Path):
    """The tokenizer saved beside the model in folder `path`."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(Path(path), local_files_only=True)
    except Exception as exc:
        raise RarelmError(f"{path}: no loadable tokenizer ({_first_line(exc)})") from None
    if len(tokenizer) < 2:  # transformers builds an empty tokenizer from config.json alone
        raise RarelmError(f"{path}: no loadable tokenizer (no tokenizer files in the folder)")
    return tokenizer


def resolve_device(device: str) -> str:
    """`auto` -> cuda when available, else cpu; `cuda` without a GPU is an error."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RarelmError("device 'cuda' was asked for, but no CUDA device is available")
    return device


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
    import torch

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


def logit_bias_processor(logit_bias):
    """A transformers LogitsProcessor adding logit_bias; generate() runs it before temperature/top-k/top-p."""
    from transformers import LogitsProcessor, LogitsProcessorList

    class LogitBias(LogitsProcessor):
        def __call__(self, input_ids, scores):
            return scores + logit_bias

    return LogitsProcessorList([LogitBias()])


def left_pad(prompts: list[list[int]], pad_id: int, device="cpu"):
    """(input ids, attention mask) with every prompt right-aligned.

    >>> ids, mask = left_pad([[5, 6, 7], [9]], pad_id=0)
    >>> ids.tolist(), mask.tolist()
    ([[5, 6, 7], [0, 0, 9]], [[1, 1, 1], [0, 0, 1]])
    """
    import torch

    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.as_tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt):] = 1
    return ids.to(device), mask.to(device)


def _continue(model, prompts: list[list[int]], n_new: int, pad_id: int, logit_bias=None, **sampling):
    import torch
    from transformers import GenerationConfig

    ids, mask = left_pad(prompts, pad_id, model.device)
    config = GenerationConfig(max_new_tokens=n_new, eos_token_id=[], pad_token_id=pad_id, **sampling)
    extra = {} if logit_bias is None else {"logits_processor": logit_bias_processor(logit_bias)}
    # generate() fills unset fields from the folder's generation_config.json (repetition penalty,
    # no-repeat n-grams, ...): swap in a blank one so the raw model is measured
    shipped, model.generation_config = model.generation_config, GenerationConfig()
    try:
        with torch.no_grad():
            out = model.generate(ids, attention_mask=mask, generation_config=config, **extra)
    finally:
        model.generation_config = shipped
    return out[:, ids.shape[1]:].cpu()


def greedy_continue(model, prompts: list[list[int]], n_new: int, pad_id: int, logit_bias=None):
    """Greedy continuations, LongTensor [len(prompts), n_new], one batched decode with the KV cache."""
    return _continue(model, prompts, n_new, pad_id, logit_bias, do_sample=False)


def sample_continue(model, prompts: list[list[int]], n_new: int, pad_id: int, temperature: float = 1.0,
                    top_k: int = 0, top_p: float = 1.0, logit_bias=None):
    """Sampled continuations [len(prompts), n_new]; seed torch's global RNG first for repeatability."""
    return _continue(model, prompts, n_new, pad_id, logit_bias, do_sample=True, temperature=temperature,
                     top_k=top_k, top_p=top_p)


def _log_softmax(logits, logit_bias):
    """float32 log-probabilities of (adjusted) logits."""
    import torch

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
    import torch

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
    import numpy as np
    import torch

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
