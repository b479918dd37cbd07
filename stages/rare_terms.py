"""Stage `rare_terms`: token frequencies, frequency buckets and rare domain terms.

    python -m stages.rare_terms

Reads the tokenized train split and the prepared train documents, writes
data/rare/ and metrics/rare_terms.json:

    counts.npy     int64 [vocab_size]  occurrences of every token id in the train split
    buckets.npy    int8 [vocab_size]   0 frequent, 1 medium, 2 rare, 3 unseen in train
    buckets.json   bucket thresholds, sizes and shares of train occurrences
    terms.jsonl    one JSON object per term: term, source (tfidf | glossary), count, df,
                   idf, score, token_ids (list of token-id sequences of the display form,
                   with/without a leading space), train_occurrences (in the whole train split,
                   whatever the case, found as `evaluate` finds them), display (the form train
                   writes most often: "PKI" for the term "pki"; the term itself if train never
                   has it), surface_forms ({form as written in train: count}, most frequent first)
    term_index.npy int64 [occurrences, 3]: (start, length, term) per term occurrence in the train
                   split, sorted by start: the tokens covering it, and its line in terms.jsonl
    term_index.json what the index was built from (hashes of terms.jsonl and the tokenizer, train
                   tokens), so `weights` and `train` refuse an index that no longer matches
    summary.json   the same as metrics/rare_terms.json

The rules (buckets, scoring, thresholds) are in rarelm/rare_terms/.
"""

import sys
from pathlib import Path

import typer

from rarelm import paths
from rarelm.errors import user_errors
from rarelm.params import load_params

app = typer.Typer(add_completion=False, help=__doc__)


@app.command()
def rare_terms(
    params_file: Path = typer.Option(paths.PARAMS, "--params", help="params.yaml to read"),
    prepared: Path = typer.Option(paths.PREPARED, help="the prepare stage's folder"),
    tokenized: Path = typer.Option(paths.TOKENIZED, help="the tokenize stage's folder"),
    out: Path = typer.Option(paths.RARE, help="output folder"),
    metrics: Path = typer.Option(paths.RARE_TERMS_METRICS, help="metrics file"),
) -> None:
    """Count token frequencies, bucket the vocabulary and extract rare domain terms."""
    # on use: their numpy would add ~0.3 s to every `rarelm` command's start-up
    from rarelm.rare_terms.stage import run, summary

    with user_errors("rare_terms"):
        params = load_params(params_file, hold=True)  # outputs refused if it changes meanwhile
        result, notice = run(params, prepared, tokenized, out, metrics)
    if notice:
        print(f"rarelm rare_terms: warning: {notice}", file=sys.stderr, flush=True)
    print(summary(result))


if __name__ == "__main__":
    app()
