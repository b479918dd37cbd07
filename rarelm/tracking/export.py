"""A complete Hugging Face folder: what `pipeline(...)`, MLflow and a reader expect beside the weights.

`train` saves the weights and copies the tokenizer into models/model, then:

    complete(folder, model_card(params, metrics, digests))

- tokenizer_config.json: `model_max_length` = the model's positions and `truncation_side`
  "left" (a prompt too long for the context keeps its end), a pad token (end-of-text) if none;
- generation_config.json: `rarelm generate`'s sampling defaults (T 0.8, top-k 50, top-p 0.95)
  and a pad token id, so `model.generate(ids)` samples as `rarelm generate` does;
- README.md: the model card (YAML metadata, data, params, metrics, intended use).

Everything written is a function of params, data and the trained weights: no time, no
absolute path, no run id, so `dvc repro` gives the same folder hash (rarelm.report.reprocheck).
A too-long prompt through transformers' pipeline is cut from the left with
`handle_long_generation="hole"`, which keeps `model_max_length - max_new_tokens` tokens:

    >>> keep_tokens(positions=128, max_new_tokens=28)
    100
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rarelm.errors import RarelmError

# `rarelm generate`'s defaults (rarelm.evaluate.generate.Sampling), in transformers' GenerationConfig names
SAMPLING = {"do_sample": True, "temperature": 0.8, "top_k": 50, "top_p": 0.95}
# params shown in the model card: what decides the weights (tracking is about where they are logged)
CARD_SECTIONS = ("seed", "alpha", "corpus", "tokenizer", "rare", "weights", "loss", "model", "train")
# train metrics in the card: not the wall-clock ones (they differ from run to run)
CARD_METRICS = ("steps", "tokens", "epochs", "parameters", "trainable_parameters", "loss", "ce",
                "rare_ce", "val_ce", "val_ppl", "val_rare_ce", "precision")


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


def model_card(params, metrics: dict[str, Any], digests: dict[str, str]) -> str:
    """README.md of the model folder: metadata for the hub, then data, params, metrics, use.

    `params` is a rarelm.params.Params, `metrics` metrics/train.json's dict, `digests`
    {data path: md5 from dvc.lock} (rarelm.tracking.datasets.dvc_hashes).
    """
    language = params.corpus.language if params.corpus.language != "auto" else "multilingual"
    flat = {k: v for k, v in params.flat().items() if k.split(".")[0] in CARD_SECTIONS}
    lines = ["---", "library_name: transformers", "pipeline_tag: text-generation",
             f"language: {language}", "tags:", "- rarelm", "- rare-terms", "- causal-lm", "---", "",
             "# rarelm model", "",
             f"A GPT-2-style causal language model ({_value(metrics.get('parameters'))} parameters) "
             f"trained by rarelm's `train` stage on `{_relative(params.corpus.path)}`, with "
             f"rare-term remedies as the params below set them (sampler alpha {params.alpha:g}).", "",
             "## Intended use", "",
             "Research on how well a fine-tuned model writes rare domain terms, and on the remedies "
             "compared by rarelm (sampling and loss reweighting). Not a general-purpose or production "
             "model: it knows only its training corpus (the built-in demo corpus is synthetic).", "",
             "## Use", "",
             "```python",
             "from transformers import pipeline",
             "generate = pipeline(\"text-generation\", model=\"models/model\")",
             "# samples with T 0.8, top-k 50, top-p 0.95 (generation_config.json); a prompt longer",
             "# than the context keeps its last tokens with handle_long_generation=\"hole\"",
             "generate(\"The patient was\", max_new_tokens=16, handle_long_generation=\"hole\")",
             "```", "", "or `rarelm generate \"The patient was\" --model models/model`.", "",
             "## Data", "", "| input | md5 (dvc.lock) |", "| --- | --- |"]
    lines += [f"| `{path}` | `{md5}` |" for path, md5 in sorted(digests.items())] or ["| (not recorded) | |"]
    lines += ["", "## Params", "", "| param | value |", "| --- | --- |"]
    lines += [f"| `{key}` | `{_relative(value) if key == 'corpus.path' else _value(value)}` |"
              for key, value in flat.items()]
    lines += ["", "## Metrics (train stage)", "", "| metric | value |", "| --- | --- |"]
    lines += [f"| `{key}` | {_value(metrics[key])} |" for key in CARD_METRICS if key in metrics]
    lines += ["", "Evaluation metrics (perplexity by bucket, rare-term exact match) are in "
              "`metrics/eval.json` and in the MLflow run of this model.", ""]
    return "\n".join(lines)


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def _relative(path: Any) -> str:
    """A path as given, or only its name if absolute (the card travels with the model)."""
    text = str(path)
    return Path(text).name if os.path.isabs(text) else text
