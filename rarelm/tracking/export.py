"""A complete Hugging Face folder: what `pipeline(...)`, MLflow and a reader expect beside the weights.

`train` saves the weights and copies the tokenizer into models/model, then:

    complete(folder, model_card(params, metrics, digests))

- tokenizer_config.json: `model_max_length` = the model's positions and `truncation_side`
  "left" (a prompt too long for the context keeps its end), a pad token (end-of-text) if none;
- generation_config.json: `rarelm generate`'s sampling defaults (T 0.8, top-k 50, top-p 0.95)
  and a pad token id, so `model.generate(ids)` samples as `rarelm generate` does;
- README.md: the model card (rarelm/tracking/card.py: huggingface_hub's ModelCard with the base
  model, data licence, eval results, training and intended use);
- every file readable by others (0644 under the usual umask): safetensors writes its weights 0600.

Everything written is a function of params, data and the trained weights: no time, no
absolute path, no run id, so `dvc repro` gives the same folder hash (rarelm.report.reprocheck).
A too-long prompt through transformers' pipeline is cut from the left with
`handle_long_generation="hole"`, which keeps `model_max_length - max_new_tokens` tokens:

    >>> keep_tokens(positions=128, max_new_tokens=28)
    100
"""

from __future__ import annotations

import json
from pathlib import Path

from rarelm.errors import RarelmError
from rarelm.files import share
from rarelm.tracking.card import model_card  # noqa: F401  (the card's own module; callers use export's name)

# `rarelm generate`'s defaults (rarelm.evaluate.generate.Sampling), in transformers' GenerationConfig names
SAMPLING = {"do_sample": True, "temperature": 0.8, "top_k": 50, "top_p": 0.95}


def keep_tokens(positions: int, max_new_tokens: int) -> int:
    """How many prompt tokens fit in the context beside `max_new_tokens` new ones (>= 1)."""
    if max_new_tokens >= positions:
        raise RarelmError(f"max_new_tokens = {max_new_tokens} is not allowed "
                          f"(must be < the model's context of {positions} tokens)")
    return positions - max_new_tokens


def positions(config) -> int | None:
    """The model's context length from its config, or None if it does not say."""
    for name in ("n_positions", "max_position_embeddings", "n_ctx", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def complete(folder: str | Path, card: str) -> None:
    """Make a saved model + tokenizer folder complete (see the module docstring)."""
    from transformers import AutoConfig, GenerationConfig  # ~6 s: the model card needs none

    folder = Path(folder)
    config = AutoConfig.from_pretrained(folder, local_files_only=True)
    eos = config.eos_token_id if isinstance(config.eos_token_id, int) else None
    _complete_tokenizer(folder / "tokenizer_config.json", positions(config))
    GenerationConfig(**SAMPLING, bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                     pad_token_id=eos).save_pretrained(folder)
    (folder / "README.md").write_text(card, encoding="utf-8")
    share(folder)


def _complete_tokenizer(path: Path, context: int | None) -> None:
    if not path.is_file():  # a tokenizer without its config: a partial one would change how it loads
        return
    tokenizer = json.loads(path.read_text(encoding="utf-8"))
    if context:
        tokenizer["model_max_length"] = context
    tokenizer["truncation_side"] = "left"
    if not tokenizer.get("pad_token") and tokenizer.get("eos_token"):
        tokenizer["pad_token"] = tokenizer["eos_token"]
    path.write_text(json.dumps(tokenizer, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                    encoding="utf-8")
