"""Where the terms occur in the train split (data/rare/term_index.npy), how train writes them,
and their token ids (the `rare_terms` stage; read back with `rarelm.artifacts.term_index`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from rarelm.artifacts.terms import Term
from rarelm.errors import RarelmError
from rarelm.files import sha256_file
from rarelm.prepare.corpus import read_split
from rarelm.rare_terms.term_search import find_occurrences


def build_term_index(tokenizer, prepared_dir: Path, data, terms: list[str],
                     batch_documents: int = 5000, sources: list[str] | None = None,
                     han_words: bool = False) -> tuple[np.ndarray, list[Counter[str]]]:
    """Every occurrence of every term in the train split, int64 [occurrences, 3], sorted,
    and each term's surface forms: how often it is written each way.

    A row is (start, length, term): the split position of the first token that
    covers the occurrence, how many tokens cover it, and the term's line in
    terms.jsonl. Occurrences are found by `term_search.find_occurrences`, the
    search `evaluate` uses (whatever the case, word-boundary aware, in the text,
    mapped to tokens by the tokenizer's offsets), `batch_documents` documents at
    a time, so memory is bounded by that batch plus the index itself (24 bytes
    per occurrence). With `han_words` (a Chinese corpus) terms match on jieba's
    word boundaries only; `sources` ("glossary" | "tfidf" per term, default
    tfidf) makes glossary terms whole words there.

        document " acute MI. Subacute MI. Acute mi"  tokens | acute| MI|.| Sub|acute| MI|.| Acute| mi|
        term "acute mi" (term 0)  -> rows (0, 2, 0) and (7, 2, 0); forms {"acute MI": 1, "Acute mi": 1}
    """
    tokens, offsets = data.tokens("train"), data.offsets("train")
    wanted = [Term(text, 0, source, han_words)
              for text, source in zip(terms, sources or ["tfidf"] * len(terms), strict=True)]
    parts, batch, first = [], [], 0
    forms: list[Counter[str]] = [Counter() for _ in terms]

    def search() -> None:
        per_term = find_occurrences(tokenizer, batch, tokens, offsets[first:first + len(batch) + 1], wanted)
        parts.append(np.array([(o.start, o.end - o.start, t) for t, found in enumerate(per_term)
                               for o in found], dtype=np.int64).reshape(-1, 3))
        for t, found in enumerate(per_term):
            forms[t].update(o.surface for o in found)

    for document in read_split(prepared_dir, "train"):
        if first + len(batch) >= len(offsets) - 1:
            raise RarelmError("the prepared train split has more documents than the tokenized one; "
                              "re-run the tokenize stage")
        batch.append(document)
        if len(batch) == batch_documents:
            search()
            first, batch = first + len(batch), []
    if batch:
        search()
    if first + len(batch) != len(offsets) - 1:
        raise RarelmError(f"the prepared train split has {first + len(batch)} documents but the tokenized "
                          f"one {len(offsets) - 1}; re-run the tokenize stage")
    index = np.concatenate(parts) if parts else np.zeros((0, 3), dtype=np.int64)
    return index[np.lexsort((index[:, 2], index[:, 0]))], forms


def surface_forms(forms: Counter[str]) -> dict[str, int]:
    """A term's forms as written in train with their counts, most frequent first (ties: in
    code-point order, capitals first), as terms.jsonl stores them.

    >>> surface_forms(Counter({"pki": 2, "PKI": 5, "Pki": 2}))
    {'PKI': 5, 'Pki': 2, 'pki': 2}
    """
    return dict(sorted(forms.items(), key=lambda item: (-item[1], item[0])))


def display_form(term: str, forms: Counter[str]) -> str:
    """How a term is shown and written: its most frequent form in train, or as extracted
    (or as the glossary gives it) if train never has it.

    >>> display_form("pki", Counter({"PKI": 5, "pki": 2})), display_form("pki", Counter())
    ('PKI', 'pki')
    """
    return next(iter(surface_forms(forms)), term)


def term_index_meta(index: np.ndarray, n_terms: int, data, rare_dir: Path) -> dict:
    """What the index was built from, so a reader can tell that it still matches."""
    return {"occurrences": int(len(index)), "terms": n_terms,
            "train_tokens": int(data.meta["splits"]["train"]["tokens"]),
            "max_length": int(index[:, 1].max()) if len(index) else 0,
            "terms_sha256": sha256_file(rare_dir / "terms.jsonl"),
            "tokenizer_sha256": sha256_file(data.tokenizer_dir / "tokenizer.json")}


def term_token_ids(tokenizer, term: str) -> list[list[int]]:
    """The token-id sequences of `term`: as is and after a space (byte-level BPE), deduplicated."""
    variants = []
    for text in (term, " " + term):
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        if ids and ids not in variants:
            variants.append(ids)
    return variants
