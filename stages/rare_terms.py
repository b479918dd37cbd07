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
from rarelm.files import atomic_dir, outputs_together, read_input, write_json
from rarelm.params import load_params

app = typer.Typer(add_completion=False, help=__doc__)


def glossary_notice(glossary: str, terms: Path) -> str | None:
    """How many of the glossary's terms terms.jsonl does not keep as terms of their own, and why
    (one line), else None. A term written twice, or the same as another but for case and spacing,
    is one term: the stage compares terms in that form (rarelm/rare_terms/segmentation.py
    `normalize_term`). Was: 13 terms listed, 7 written, and no word about it."""
    import json

    from rarelm.rare_terms.segmentation import normalize_term

    if not glossary:
        return None
    lines = read_input("rare.glossary", glossary).decode("utf-8-sig").splitlines()
    if lines and "\t" in lines[0] and lines[0].split("\t")[0].strip().lower() == "term":
        lines = [line.split("\t")[0] for line in lines[1:]]  # a TSV: its term column, as read_glossary
    listed = [line.strip() for line in lines if line.strip()]
    kept = sum(json.loads(line).get("source") == "glossary"
               for line in terms.read_text(encoding="utf-8").splitlines() if line.strip())
    if kept >= len(listed):
        return None
    seen: dict[str, str] = {}
    pair = None
    for term in listed:
        key = normalize_term(term)
        if key in seen and pair is None:
            pair = (term, seen[key])
        seen.setdefault(key, term)
    example = f" (e.g. {pair[0]!r} is {pair[1]!r})" if pair else ""
    return (f"rare.glossary {glossary} lists {len(listed)} terms, {kept} kept: {len(listed) - kept} "
            f"repeat another one, the same but for case or spacing{example}; terms are compared in "
            "lower case with single spaces, and the last spelling is kept")


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
    from rarelm.artifacts.buckets import BUCKET_NAMES
    from rarelm.rare_terms import stage

    with user_errors("rare_terms"):
        params = load_params(params_file, hold=True)  # outputs refused if it changes meanwhile
        with outputs_together(), atomic_dir(out) as tmp:  # both outputs change, or neither does
            result = stage.rare_terms(params.rare, params.corpus.reference_glossary, prepared,
                                      tokenized, tmp)
            notice = glossary_notice(params.rare.glossary, tmp / "terms.jsonl")
            write_json(metrics, result)
    if notice:
        print(f"rarelm rare_terms: warning: {notice}", file=sys.stderr, flush=True)
    b = result["buckets"]
    shares = ", ".join(f"{n} {b[n]['tokens']} ({b[n]['share']:.1%})" for n in BUCKET_NAMES)
    scored = ""
    if "extraction" in result:
        e = result["extraction"]
        scored = f"; vs reference P {e['precision']:.3f} R {e['recall']:.3f} F1 {e['f1']:.3f}"
    print(f"rare_terms: buckets {shares}; {result['terms']} terms ({result['tfidf_terms']} tfidf, "
          f"{result['glossary_terms']} glossary, {result['language']}){scored}")


if __name__ == "__main__":
    app()
