"""Reading the `rare_terms` stage's terms (data/rare/terms.jsonl), one `Term` per line, in order.

A line's position is the term's number everywhere else (term_index.npy rows,
evaluation results). A term is read in its display form, the way train writes
it most often, with its occurrences in the whole train split.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from rarelm.errors import RarelmError


@dataclasses.dataclass(frozen=True)
class Term:
    text: str  # as shown: its display form (any case finds it)
    count: int  # occurrences in the train split (how rare the term is)
    source: str = "tfidf"  # glossary | tfidf: glossary terms are whole words in Chinese segmentation
    # a Chinese corpus's term: found only on jieba's word boundaries, never inside a longer word
    # (rarelm/rare_terms/term_search.py); terms.jsonl's "han_words", absent = false
    han_words: bool = False


def load_terms(path: str | Path) -> list[Term]:
    """Read terms.jsonl; a missing file or a malformed line is a one-line RarelmError."""
    path = Path(path)
    if not path.is_file():
        raise RarelmError(f"{path}: no such file; run the rare_terms stage first")
    terms = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                # display: the term's most frequent form in train ("PKI" for the term "pki")
                text = str(row.get("display", row["term"]))
                if not text.strip():
                    raise ValueError("empty term")
                # train_occurrences: the whole train split, by rare_terms.term_search (rare_terms
                # writes it); count: TF-IDF's, over at most rare.max_documents documents
                terms.append(Term(text, int(row.get("train_occurrences", row["count"])),
                                  str(row.get("source", "tfidf")), bool(row.get("han_words", False))))
            except (ValueError, KeyError, TypeError) as exc:
                raise RarelmError(
                    f"{path}:{line_no}: not a term record ({type(exc).__name__}: {exc})") from None
    return terms
