"""The `tokenize` stage, start to end: build the tokenizer, encode every split, write
data/tokenized/ and its stats (see stages/tokenize.py; the work is in rarelm/tokenize/tokenization.py)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from rarelm.errors import RarelmError
from rarelm.files import atomic_dir, outputs_together, read_json, write_json
from rarelm.tokenize import tokenization


def run(params, prepared: Path, out: Path, metrics: Path) -> dict:
    """Write the tokenizer and token arrays to `out` (with meta.json) and the token counts to
    `metrics`; returns meta.json's content. `params` is the full Params (`tokenizer`, `rare`)."""
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
    return meta


def summary(meta: dict) -> str:
    """The stage's one summary line."""
    counts = ", ".join(f"{s} {v['tokens']}" for s, v in meta["splits"].items())
    added = f", {meta['added_terms']} terms added as tokens" if "added_terms" in meta else ""
    return f"tokenize: vocabulary {meta['vocab_size']} ({meta['tokenizer']}{added}), tokens: {counts}"
