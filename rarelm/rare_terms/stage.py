"""The `rare_terms` stage, start to end: read and check everything, count, bucket, extract
terms, find them in the train split, then write data/rare/ (see stages/rare_terms.py).

`run` writes the stage's outputs together; `rare_terms` is its work into one folder;
`summary` and `glossary_notice` are the lines it prints."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np

from rarelm.artifacts.buckets import BUCKET_NAMES
from rarelm.artifacts.term_index import TERM_INDEX, TERM_INDEX_META
from rarelm.artifacts.tokenized import TokenizedData, load_tokenizer
from rarelm.errors import RarelmError
from rarelm.files import atomic_dir, outputs_together, read_input, read_json, write_json
from rarelm.prepare.corpus import read_split
from rarelm.progress import Steps
from rarelm.rare_terms.buckets import bucket_tokens, count_tokens
from rarelm.rare_terms.glossary import extraction_scores, read_glossary, read_reference
from rarelm.rare_terms.quality import fragment_filter, term_list_quality
from rarelm.rare_terms.segmentation import Segmenter, normalize_term
from rarelm.rare_terms.term_index import (
    build_term_index,
    display_form,
    surface_forms,
    term_index_meta,
    term_token_ids,
)
from rarelm.rare_terms.tfidf import TermStats, count_phrases, tfidf_terms


def training_documents(prepared_dir: Path, n_train: int, max_documents: int) -> list[str]:
    """The train split's documents, or `max_documents` of them evenly spread (bounds TF-IDF memory)."""
    stride = max(1, math.ceil(n_train / max_documents))
    return [doc for i, doc in enumerate(read_split(prepared_dir, "train")) if i % stride == 0]


@dataclasses.dataclass
class TermList:
    """The term list and what it was read from (`term_list`)."""

    language: str
    documents: list[str]  # the train documents TF-IDF and the counts read
    segmenter: Segmenter
    glossary: list[str]
    extracted: list[TermStats]  # TF-IDF's terms, best first
    table: list[dict]  # terms.jsonl's rows before their occurrences: glossary terms, then TF-IDF's


def term_list(params, prepared_dir: Path, steps: Steps | None = None) -> TermList:
    """The terms of the prepared corpus by the `rare` params (RareParams): the glossary's first,
    then TF-IDF's; text alone decides them, so `tokenize` (tokenizer.add_terms) reads the same list
    before any token exists. `steps` logs each part as it ends (minutes on a big corpus)."""
    done = steps.done if steps is not None else (lambda name: 0.0)
    glossary = read_glossary(params.glossary) if params.glossary else []
    stats = _prepared_stats(prepared_dir)
    language = stats["language"]
    documents = training_documents(prepared_dir, stats["train"]["documents"], params.max_documents)
    segmenter = Segmenter(language, glossary)
    # rare.tfidf_all_splits: val/test documents may contribute terms (unseen in train: the "seen 0-1"
    # stratum of evaluate); every term's count stays the train split's (add_occurrences)
    held_out = [d for split in ("val", "test") for d in read_split(prepared_dir, split)] \
        if params.tfidf_all_splits else []
    done(f"reading {len(documents) + len(held_out):,} documents")
    # Chinese terms match on jieba's word boundaries, never inside a longer word (term_search)
    han_words = language == "zh"
    # a Chinese candidate mostly inside longer words is a fragment (English words are whole by
    # their spaces, and a plural would make "api" a piece of "APIs"), judged on the documents
    # TF-IDF reads: with rare.tfidf_all_splits a candidate from val/test text is judged there too,
    # not only where train happens to use it whole
    fragment = None if not han_words or params.max_inside_share >= 1 else \
        fragment_filter(documents + held_out, han_words, params.max_inside_share, tuple(glossary))
    if fragment is not None:
        done("the fragment filter (words inside longer words)")
    # rare.tfidf: false: the glossary supplies the terms (a corpus with its own: foldoc_en)
    extracted = tfidf_terms(documents + held_out, segmenter, params.ngram_max, params.min_df, params.max_df,
                            params.min_count, params.min_mean_tf, params.top_k,
                            fragment) if params.tfidf else []
    if params.tfidf:
        done(f"TF-IDF terms ({len(extracted):,})")
    table = term_table(count_phrases(documents, segmenter, glossary, len(documents)), extracted)
    done(f"the term list ({len(table):,} terms)")
    return TermList(language, documents, segmenter, glossary, extracted, table)


def run(params, prepared: Path, tokenized: Path, out: Path, metrics: Path) -> tuple[dict, str | None]:
    """Write data/rare/ to `out` and its summary to `metrics`, together; returns the metrics and
    the glossary's notice (`glossary_notice`). `params` is the full Params (`rare`, and
    `corpus.reference_glossary`)."""
    with outputs_together(), atomic_dir(out) as tmp:  # both outputs change, or neither does
        result = rare_terms(params.rare, params.corpus.reference_glossary, prepared, tokenized, tmp)
        notice = glossary_notice(params.rare.glossary, tmp / "terms.jsonl")
        write_json(metrics, result)
    return result, notice


def summary(result: dict) -> str:
    """The stage's one summary line."""
    b = result["buckets"]
    shares = ", ".join(f"{n} {b[n]['tokens']} ({b[n]['share']:.1%})" for n in BUCKET_NAMES)
    scored = ""
    if "extraction" in result:
        e = result["extraction"]
        scored = f"; vs reference P {e['precision']:.3f} R {e['recall']:.3f} F1 {e['f1']:.3f}"
    return (f"rare_terms: buckets {shares}; {result['terms']} terms ({result['tfidf_terms']} tfidf, "
            f"{result['glossary_terms']} glossary, {result['language']}){scored}")


def glossary_notice(glossary: str, terms: Path) -> str | None:
    """How many of the glossary's terms terms.jsonl does not keep as terms of their own, and why
    (one line), else None. A term written twice, or the same as another but for case and spacing,
    is one term: the stage compares terms in that form (rarelm/rare_terms/segmentation.py
    `normalize_term`). Was: 13 terms listed, 7 written, and no word about it."""
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


def rare_terms(params, reference_glossary: str, prepared_dir: Path, tokenized_dir: Path,
               out_dir: Path) -> dict:
    """The whole stage's work into out_dir (see stages/rare_terms.py); returns the metrics.

    `params` is RareParams. Everything is read and checked before the first file is written.
    """
    data = TokenizedData.open(tokenized_dir)
    tokenizer = load_tokenizer(data.tokenizer_dir, data.vocab_size)
    reference = read_reference(reference_glossary) if reference_glossary else []
    steps = Steps("rare_terms")
    terms = term_list(params, prepared_dir, steps)
    language, documents, segmenter, glossary, extracted, table = (
        terms.language, terms.documents, terms.segmenter, terms.glossary, terms.extracted, terms.table)
    han_words = language == "zh"

    counts = count_tokens(data.tokens("train"), data.vocab_size, params.chunk_tokens)
    buckets, bucket_summary = bucket_tokens(counts, params.frequent_share, params.rare_share)
    steps.done(f"counting {len(data.tokens('train')):,} train tokens")

    metrics = {"language": language, "documents": len(documents),
               "terms": len(table), "tfidf_terms": len(extracted), "glossary_terms": len(glossary),
               "buckets": {name: {k: bucket_summary[name][k] for k in ("tokens", "share")}
                           for name in BUCKET_NAMES}}
    if reference:
        metrics["extraction"] = extraction_scores([st.term for st in extracted], reference)
        in_train = count_phrases(documents, segmenter, reference, len(documents))
        # recall cannot exceed this: reference terms that occur in the training documents at all
        metrics["extraction"]["reference_in_train"] = sum(st.df > 0 for st in in_train.values())
        steps.done("scoring the extraction against the reference glossary")

    index = add_occurrences(table, tokenizer, prepared_dir, data, han_words)
    metrics["term_occurrences"] = int(len(index))
    steps.done(f"finding the terms' {len(index):,} train occurrences")
    metrics["terms_found_in_train"] = sum(row["train_occurrences"] > 0 for row in table)
    metrics["term_list_quality"] = term_list_quality(
        table, list(read_split(prepared_dir, "test")), han_words,
        tuple(row["term"] for row in table if row["source"] == "glossary"))
    steps.done("the term list's quality on the test split")

    np.save(out_dir / "counts.npy", counts)
    np.save(out_dir / "buckets.npy", buckets)
    write_json(out_dir / "buckets.json", bucket_summary)
    write_terms(out_dir / "terms.jsonl", table)
    np.save(out_dir / TERM_INDEX, index)
    write_json(out_dir / TERM_INDEX_META, term_index_meta(index, len(table), data, out_dir))
    write_json(out_dir / "summary.json", metrics)
    return metrics


def _prepared_stats(prepared_dir: Path) -> dict:
    try:
        return read_json(prepared_dir / "stats.json")
    except FileNotFoundError:
        raise RarelmError(f"{prepared_dir}: no stats.json; run the prepare stage first") from None


def term_table(from_glossary: dict[str, TermStats], extracted: list[TermStats]) -> list[dict]:
    """terms.jsonl's rows before their occurrences: glossary terms first, then TF-IDF terms,
    each by score (best first) then term; a TF-IDF term the glossary has is the glossary's."""
    rows: dict[str, dict] = {}
    for term, st in from_glossary.items():
        rows[normalize_term(term)] = {"term": term, "source": "glossary", **_numbers(st)}
    for st in extracted:
        rows.setdefault(normalize_term(st.term), {"term": st.term, "source": "tfidf", **_numbers(st)})
    return sorted(rows.values(), key=lambda r: (r["source"] != "glossary", -r["score"], r["term"]))


def _numbers(st: TermStats) -> dict:
    return {"count": st.count, "df": st.df, "idf": round(st.idf, 6), "score": round(st.score, 6)}


def add_occurrences(table: list[dict], tokenizer, prepared_dir: Path, data: TokenizedData,
                    han_words: bool = False) -> np.ndarray:
    """Find every term of `table` in the train split; each row gains its token ids, train
    occurrences, display form and surface forms (and han_words: true in a Chinese corpus,
    so `evaluate` searches as here). Returns the term index."""
    index, forms = build_term_index(tokenizer, prepared_dir, data, [row["term"] for row in table],
                                    sources=[row["source"] for row in table], han_words=han_words)
    found = np.bincount(index[:, 2], minlength=len(table))
    for row, n, written in zip(table, found.tolist(), forms, strict=True):
        display = display_form(row["term"], written)
        row["token_ids"] = term_token_ids(tokenizer, display)
        row["train_occurrences"] = n  # in the whole train split, by the search evaluate uses
        row["display"] = display  # the term as it is written most often in train
        row["surface_forms"] = surface_forms(written)  # every way train writes it, with counts
        if han_words:
            row["han_words"] = True  # found on jieba's word boundaries only (Term.han_words)
    return index


def write_terms(path: Path, table: list[dict]) -> None:
    """terms.jsonl: one JSON object per line, UTF-8 as is."""
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for row in table:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
