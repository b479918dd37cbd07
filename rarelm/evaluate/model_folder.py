"""A local Hugging Face causal LM folder: its model, its tokenizer, the device to run it on.

Any folder works (the pipeline's own GPT-2-style model or a fine-tuned pretrained
one); a bad folder is a one-line RarelmError:

    model = load_causal_lm("models/model")          # eval mode, on cpu
    tokenizer = load_model_tokenizer("models/model")
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging

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
    logging.disable_progress_bar()  # no "Loading weights" bar on stderr: a stage prints one line
    logging.set_verbosity_error()
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, config=config, local_files_only=True)
    except Exception as exc:  # transformers raises ValueError/OSError/KeyError/... for a bad folder
        raise RarelmError(f"{path}: not a loadable causal language model ({_first_line(exc)})") from None
    return model.to(resolve_device(device)).eval()


def load_model_tokenizer(path: str | Path):
    """The tokenizer saved beside the model in folder `path`."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(Path(path), local_files_only=True)
    except Exception as exc:
        raise RarelmError(f"{path}: no loadable tokenizer ({_first_line(exc)})") from None
    if len(tokenizer) < 2:  # transformers builds an empty tokenizer from config.json alone
        raise RarelmError(f"{path}: no loadable tokenizer (no tokenizer files in the folder)")
    return tokenizer


def resolve_device(device: str) -> str:
    """`auto` -> cuda when available, else cpu; `cuda` without a GPU is an error."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise RarelmError("device 'cuda' was asked for, but no CUDA device is available")
    return device
