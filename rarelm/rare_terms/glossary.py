"""Glossaries: the user's (terms always kept) and a reference one (to score the extraction against)."""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

from rarelm.errors import RarelmError
from rarelm.files import read_input
from rarelm.rare_terms.segmentation import normalize_term


def read_glossary(path: str | Path) -> list[str]:
    """A user glossary: one term per line (UTF-8), or a TSV whose header's first column is
    `term` (its first column; data/raw/foldoc_en.glossary.tsv); blank lines and duplicates
    are skipped. Read with the corpus' guards (`read_input`: a regular file, bounded size)."""
    path = Path(path)
    try:
        text = read_input("rare.glossary", path).decode("utf-8-sig")
    except FileNotFoundError:
        raise RarelmError(f"rare.glossary: no such file: {path}") from None
    except UnicodeDecodeError as exc:
        raise RarelmError(f"rare.glossary: {path} is not valid UTF-8 (byte {exc.start}); "
                          "save it as UTF-8, one term per line") from None
    lines = text.splitlines()
    if lines and "\t" in lines[0] and lines[0].split("\t")[0].strip().lower() == "term":
        lines = [line.split("\t")[0] for line in lines[1:]]
    terms = list(dict.fromkeys(t for line in lines if (t := " ".join(line.split()))))
    if not terms:
        raise RarelmError(f"rare.glossary: {path} holds no term (one term per line, UTF-8)")
    return terms


def read_reference(path: str | Path) -> list[str]:
    """A reference glossary: a TSV with a header whose first column is `term`, or one term per line."""
    path = Path(path)
    try:
        lines = read_input("corpus.reference_glossary", path).decode("utf-8-sig").splitlines()
    except FileNotFoundError:
        raise RarelmError(f"corpus.reference_glossary: no such file: {path}") from None
    except UnicodeDecodeError:
        raise RarelmError(f"corpus.reference_glossary: {path} is not valid UTF-8") from None
    if lines and lines[0].split("\t")[0].strip().lower() == "term":
        rows = csv.reader(lines[1:], delimiter="\t")
        terms = [row[0] for row in rows if row and row[0].strip()]
    else:
        terms = [line for line in lines if line.strip()]
    if not terms:
        raise RarelmError(f"corpus.reference_glossary: {path} holds no term")
    return terms


def extraction_scores(found: Iterable[str], reference: Iterable[str]) -> dict:
    """Precision, recall and F1 of extracted terms against a reference, compared normalised.

    >>> s = extraction_scores(["a b", "c"], ["A  b", "d", "e"])
    >>> s["precision"], round(s["recall"], 3), s["f1"], s["true_positives"]
    (0.5, 0.333, 0.4, 1)
    """
    found_set = {normalize_term(t) for t in found}
    ref_set = {normalize_term(t) for t in reference}
    hits = len(found_set & ref_set)
    precision = hits / len(found_set) if found_set else 0.0
    recall = hits / len(ref_set) if ref_set else 0.0
    f1 = 2 * precision * recall / (precision + recall) if hits else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "true_positives": hits,
            "extracted": len(found_set), "reference": len(ref_set)}
