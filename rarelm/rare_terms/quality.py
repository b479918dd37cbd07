"""How good a term list is, as metrics/rare_terms.json reports it (the `rare_terms` stage).

Two figures a reader can check a term list by:

- **Inside a longer word**: of every place in the test split where a term's string
  appears (whatever its case), the share that is no occurrence because it sits inside
  a longer word: in English not on word boundaries (a letter or digit right before or
  after: "art" in "start"); in Chinese not on jieba's word boundaries (态 in 状态). A list
  of real terms finds few such places; fragments of words (接字, 态) find many.
- **Repeat share**: of the test occurrences, the share that repeat a term already found
  earlier in their document (`test_repeat_share`): the case a cache copies from the context,
  where a term's first mention is the case a user brings.
- **Terms by train count**: how many terms the train split holds 0-1, 2-15 and 16 or
  more times (`train_occurrences`, the search `evaluate` uses): the strata the
  evaluation reports separately.

The share counts matches, so short terms weigh most ("ti" is in every "-tion"); the number of
terms whose test matches sit inside longer words more often than not tells how many terms
that is (`terms_mostly_inside_longer_words`, of `terms_in_test`, the terms with a match).

    >>> rows = [{"term": "art", "train_occurrences": 1}, {"term": "start", "train_occurrences": 20}]
    >>> q = term_list_quality(rows, ["start art. arts"], han_words=False)
    >>> q["test_matches"], q["test_occurrences"], q["inside_longer_word"], q["inside_longer_word_share"]
    (4, 2, 2, 0.5)
    >>> q["terms_by_train_count"], q["terms_mostly_inside_longer_words"], q["terms_in_test"]
    ({'0-1': 1, '2-15': 0, '16_up': 1}, 1, 2)
    >>> [term_list_quality(rows, docs, han_words=False)["test_repeat_share"]   # art, art | art: 1 of 3
    ...  for docs in (["start art. arts", "art"], ["art, art", "art"])]
    [0.0, 0.333333]
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from rarelm.rare_terms.term_search import FoldedText

STRATA = ("0-1", "2-15", "16_up")  # train occurrences: 0-1, 2-15, 16 or more


def stratum(train_count: int) -> str:
    """The train-frequency stratum of a term.

    >>> [stratum(c) for c in (0, 1, 2, 15, 16)]
    ['0-1', '0-1', '2-15', '2-15', '16_up']
    """
    return STRATA[0] if train_count <= 1 else STRATA[1] if train_count <= 15 else STRATA[2]


def term_list_quality(rows: list[dict], test_documents: list[str], han_words: bool,
                      glossary: tuple[str, ...] = ()) -> dict:
    """The term list's quality on the test documents (see the module docstring).

    `rows` are terms.jsonl's rows (`term` or `display`, `train_occurrences`); `han_words`
    and `glossary` as `term_search.find_in_text` takes them (a Chinese corpus: True, and
    its glossary terms, kept whole).
    """
    text = FoldedText("\n".join(test_documents))
    doc_starts = np.cumsum([0] + [len(d) + 1 for d in test_documents[:-1]])
    matches = occurrences = mostly_inside = in_test = repeats = 0
    for row in rows:
        term = row.get("display", row["term"])
        if "\n" in term:
            continue
        term_matches = len(text.find(term, words=False))
        found = text.find(term, han_words, glossary)
        term_occurrences = len(found)
        docs = np.searchsorted(doc_starts, [start for start, _ in found], side="right")
        repeats += term_occurrences - len(set(docs.tolist()))  # all but the first in each document
        matches += term_matches
        occurrences += term_occurrences
        in_test += term_matches > 0
        mostly_inside += term_matches - term_occurrences > term_occurrences
    strata = dict.fromkeys(STRATA, 0)
    for row in rows:
        strata[stratum(row["train_occurrences"])] += 1
    inside = matches - occurrences
    return {"test_matches": matches, "test_occurrences": occurrences, "inside_longer_word": inside,
            "inside_longer_word_share": round(inside / matches, 6) if matches else 0.0,
            "test_repeat_share": round(repeats / occurrences, 6) if occurrences else 0.0,
            "terms_in_test": in_test, "terms_mostly_inside_longer_words": mostly_inside,
            "terms_by_train_count": strata}


def fragment_filter(documents: list[str], han_words: bool, max_inside_share: float,
                    glossary: tuple[str, ...] = ()) -> Callable[[str], bool]:
    """A test of a candidate term: True (a fragment) where more than `max_inside_share` of its
    string's matches in `documents` sit inside longer words ("arg" in "argument", 括号 in 圆括号).
    TF-IDF counts a candidate where the segmentation reads it as a word, so a word that is
    mostly a piece of longer ones still scores; the search would then find it rarely and the
    quality figure above would count it (rare.max_inside_share; 1 turns the test off).

    >>> is_fragment = fragment_filter(["arg argument arguments", "key keys key"], False, 0.25)
    >>> is_fragment("arg"), is_fragment("key")   # arg: 2 of 3 matches inside; key: 1 of 3
    (True, True)
    >>> fragment_filter(["key keys key"], False, 0.5)("key")
    False
    """
    text = FoldedText("\n".join(documents))

    def is_fragment(term: str) -> bool:
        matches = len(text.find(term, words=False))
        inside = matches - len(text.find(term, han_words, glossary)) if matches else 0
        return inside > max_inside_share * matches

    return is_fragment
