"""Stage `tokenize`: prepared splits -> tokenizer + memory-mapped token arrays.

    python -m stages.tokenize

Trains a byte-level BPE tokenizer on the train split (or copies the local
pretrained one in `tokenizer.name_or_path`) and writes data/tokenized/ (see
rarelm.tokenize.tokenization for the layout) and metrics/tokenize.json. With
`tokenizer.add_terms` the domain's terms (the `rare` params' term list) are added
to it as whole tokens first (rarelm.tokenize.added_terms, added_terms.json).
"""

from pathlib import Path

import typer

from rarelm import paths
from rarelm.errors import user_errors
from rarelm.params import load_params

app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def tokenize(
    params_file: Path = typer.Option(paths.PARAMS, "--params", help="params.yaml to read"),
    prepared: Path = typer.Option(paths.PREPARED, help="the prepare stage's folder"),
    out: Path = typer.Option(paths.TOKENIZED, help="output folder"),
    metrics: Path = typer.Option(paths.TOKENIZE_METRICS, help="stats file"),
) -> None:
    """Build the tokenizer and encode every split."""
    # on use: numpy and rich would add ~0.4 s to every `rarelm` command's start-up (`rarelm --help`)
    from rarelm.tokenize.stage import run, summary

    with user_errors("tokenize"):
        params = load_params(params_file, hold=True)  # outputs refused if it changes meanwhile
        meta = run(params, prepared, out, metrics)
    print(summary(meta))


if __name__ == "__main__":
    app()
