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
from rarelm.errors import RarelmError, user_errors
from rarelm.files import atomic_dir, outputs_together, read_json, write_json
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
    from rich.console import Console
    from rich.progress import Progress

    from rarelm.tokenize import tokenization

    with user_errors("tokenize"):
        params = load_params(params_file, hold=True)  # outputs refused if it changes meanwhile
        try:
            stats = read_json(prepared / "stats.json")
        except FileNotFoundError:
            raise RarelmError(f"{prepared}: no stats.json; run the prepare stage first") from None
        total = sum(stats[s]["documents"] for s in ("train", "val", "test"))
        # the bar goes to stderr so stdout holds only the summary line; none in a log (where the
        # transient bar left a blank line)
        console = Console(stderr=True)
        with outputs_together(), atomic_dir(out) as tmp:  # both outputs change, or neither does
            with Progress(console=console, transient=True, disable=not console.is_terminal) as bar:
                task = bar.add_task("tokenize: encoding documents", total=total)
                meta = tokenization.tokenize(params.tokenizer, prepared, tmp,
                                             progress=lambda n: bar.advance(task, n), rare=params.rare)
            write_json(tmp / "meta.json", meta)
            write_json(metrics, {"vocab_size": meta["vocab_size"],
                                 **{f"{s}_tokens": v["tokens"] for s, v in meta["splits"].items()}})
    counts = ", ".join(f"{s} {v['tokens']}" for s, v in meta["splits"].items())
    added = f", {meta['added_terms']} terms added as tokens" if "added_terms" in meta else ""
    print(f"tokenize: vocabulary {meta['vocab_size']} ({meta['tokenizer']}{added}), tokens: {counts}")


if __name__ == "__main__":
    app()
