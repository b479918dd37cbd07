"""Everything about params.yaml that a stage would refuse, checked before any stage runs.

DVC deletes a stage's outputs before it runs the stage's command, so a stage that refuses its
params after that has already lost its previous outputs: train refusing `model.block_size: 512`
for a model of 256 positions left no models/model. The `check` stage (dvc.yaml) runs this first:
every other stage descends from it, and `dvc repro` stops at the first stage that fails.

    summary = check(load_params("params.yaml"))   # a RarelmError naming the first bad key
    # 'corpus data/raw/demo_en.txt.gz (1 file), a GPT-2-style model from scratch (block 128), ...'

What it reads: params.yaml (every key, as every stage does), the corpus path, the glossary and
text files that params name, a pretrained model's config, tokenizer and weight headers (not its
weights), and this machine's memory. Nothing is downloaded: a hub id must already be in the
local Hugging Face cache (rarelm/hub.py). The same functions refuse the same things in the
stages themselves, so `rarelm <stage>` outside DVC says the same line, later.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from rarelm.errors import RarelmError
from rarelm.files import atomic_file
from rarelm.params import Params

# data/checked.txt's text, which never changes: its hash, a dep of prepare, stays the same
MARKER = "params.yaml passed `python -m stages.check` (rarelm/check.py); every stage runs after it.\n"


def run(params: Params, out: Path) -> str:
    """The check stage: `check`, then leave the marker at `out` (written only where it is missing
    or differs, so a passing check touches nothing); returns `check`'s line."""
    checked = check(params)
    if not out.is_file() or out.read_text(encoding="utf-8") != MARKER:
        with atomic_file(out) as f:
            f.write(MARKER)
    return checked


def summary(params_file: Path, checked: str) -> str:
    """The stage's one summary line."""
    return f"check: {params_file} is valid: {checked}"


def check(params: Params) -> str:
    """Refuse the first param a stage would refuse (a RarelmError); else a line saying what was checked."""
    files = check_inputs(params)
    model = check_model(params)
    check_training(params)
    return f"corpus {params.corpus.path} ({files} file{'s' * (files != 1)}), {model}"


def check_inputs(params: Params) -> int:
    """The corpus (its files' count) and every other file params name: glossaries, general text."""
    from rarelm.evaluate.general_text import read_documents, resolve
    from rarelm.files import read_input
    from rarelm.prepare.corpus import corpus_files
    from rarelm.rare_terms.glossary import read_glossary, read_reference

    files = corpus_files(params.corpus)
    if params.corpus.reference_glossary:
        read_reference(params.corpus.reference_glossary)
    if params.rare.glossary:
        read_glossary(params.rare.glossary)
    for key, kind in (("general_text", ""), ("general_text_outside", ".outside")):
        # auto with corpus.language auto: None
        general = resolve(getattr(params.eval, key), params.corpus.language, kind)
        if general is not None:
            read_documents(general, f"eval.{key}")
    if params.train.replay_share:
        try:  # with the input guards, as train reads it: a FIFO or a device is called what it is
            read_input("train.replay_text", params.train.replay_text)
        except FileNotFoundError:
            raise RarelmError(f"params: train.replay_text = {params.train.replay_text!r}: no such file "
                              "(a UTF-8 text file, one document a line; e.g. data/general/en.replay.txt)"
                              ) from None
    return len(files)


def check_model(params: Params) -> str:
    """The tokenizer and model ids (local folders or hub ids already cached), a pretrained model's
    config, tokenizer and weight shapes, and the block sizes against its positions."""
    from rarelm.hub import resolve

    tokenizer, model = params.tokenizer.name_or_path, params.model.name_or_path
    tokenizer_dir = resolve(tokenizer, "tokenizer.name_or_path").path if tokenizer else None
    if not model:
        context = params.model.block_size  # a model from scratch has these positions
        what = f"a GPT-2-style model from scratch (block {context})"
    elif tokenizer_dir is None:
        raise RarelmError(f"params: tokenizer.name_or_path = '' is not allowed with model.name_or_path = "
                          f"{model!r} (tokenize would train a new BPE tokenizer that the model does not "
                          f"know: set tokenizer.name_or_path to {model!r})")
    else:
        from rarelm.evaluate.decoding import context_length
        from rarelm.train.model import check_pretrained_with

        config = check_pretrained_with(params.model, tokenizer_dir, f"tokenizer.name_or_path's ({tokenizer})")
        context = context_length(SimpleNamespace(config=config))  # as evaluate reads it
        what = (f"model {model} ({config.model_type}, {context or 'unknown'} positions, "
                f"block {params.model.block_size})")
    block = params.eval.block_size
    if context and block > context:
        raise RarelmError(f"params: eval.block_size = {block} is not allowed "
                          f"(must be <= the model's context length {context})")
    return what + (f", tokenizer {tokenizer}" if tokenizer else ", a BPE tokenizer trained by tokenize")


def check_training(params: Params) -> None:
    """What train's launcher refuses before its workers start: FSDP in one process, LoRA target
    modules the model lacks, a micro-batch that cannot fit in this machine's memory, TensorBoard
    asked for but not installed."""
    import torch

    from rarelm.tracking.run import check_tensorboard
    from rarelm.train import lora
    from rarelm.train.bounds import check_batch_fits
    from rarelm.train.sharding import check_world_size

    check_world_size(params.train.strategy, params.train.nproc)
    lora.check(params.model)
    check_batch_fits(params, params.train.nproc, cpu=not torch.cuda.is_available())
    check_tensorboard(params.tracking)
