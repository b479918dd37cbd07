"""Scoring candidate terms by TF-IDF over the training documents (the `rare_terms` stage).

Over the training documents scikit-learn's `TfidfVectorizer` (raw counts,
smooth idf = ln((1 + N) / (1 + df)) + 1 from this corpus, no normalisation)
gives each candidate's TF-IDF in every document; a term's score is its mean
TF-IDF over the documents that contain it, i.e. (count / df) * idf: high for
a phrase that is rare in the corpus (idf) but repeated where it occurs.
Candidates must satisfy `min_df <= df <= max_df * N`, occur at least
`min_count` times, and `min_mean_tf` times per document that has them (domain
terms are bursty: a text that uses one tends to repeat it, while one-off
phrases occur once; 1.0 turns this off). A candidate is dropped when every one
of its occurrences extends, on the same side, to its next longer candidate
that scores at least as high: it is only ever part of better terms
("nephrosclerosis" inside "bilateral nephrosclerosis"; Chinese "利率私募债"
inside "浮动利率私募债" and "固定利率私募债"). At most `top_k` terms are kept,
best score first (ties by term, alphabetically). A single Han character is
never a TF-IDF term (态, 键: in Chinese a term of one character is one only
when a glossary says so). TF-IDF runs on at most
`rare.max_documents` training documents, every k-th one (its vocabulary of
n-grams is what takes memory); token counts always cover the whole split.
Terms of the user glossary (`rare.glossary`) are always kept as given, none
of the rules above applies to them, and Chinese segmentation treats them as
single words so they stay whole.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable

import numpy as np
from sklearn.feature_extraction.text import TfidfVectorizer

from rarelm.rare_terms.segmentation import Segmenter, join_words, normalize_term

_ONE_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


@dataclasses.dataclass(frozen=True)
class TermStats:
    term: str
    count: int  # occurrences in the training documents
    df: int  # training documents containing it
    idf: float  # ln((1 + N) / (1 + df)) + 1
    score: float  # (count / df) * idf: mean TF-IDF where it occurs; 0 if df = 0


def smooth_idf(df: int, n_docs: int) -> float:
    """scikit-learn's smooth idf."""
    return math.log((1 + n_docs) / (1 + df)) + 1.0


def _next_shorter_candidate(words: list[str], side: int, by_name: dict[str, int], sep: str) -> int | None:
    """The longest candidate that `words` extends on one side (0: left, 1: right), if any.

    Candidates between may be missing: "可回售票据" ends with the function word 据, so
    "可回售票据工具" (可回/售票/据/工具) is the next longer candidate of "可回售票".

        >>> _next_shorter_candidate(["a", "b", "c"], 0, {"c": 7, "b c": 8}, " ")
        8
        >>> _next_shorter_candidate(["a", "b", "c"], 1, {"a": 5}, " ")
        5
    """
    for cut in range(1, len(words)):
        part = words[cut:] if side == 0 else words[:-cut]
        j = by_name.get(sep.join(part))
        if j is not None:
            return j
    return None


def tfidf_terms(documents: list[str], segmenter: Segmenter, ngram_max: int, min_df: int,
                max_df: float, min_count: int, min_mean_tf: float, top_k: int,
                fragment: Callable[[str], bool] | None = None) -> list[TermStats]:
    """The `top_k` TF-IDF terms of `documents`, best first (scoring in the module docstring),
    skipping those that `fragment` calls a piece of longer words (rare_terms/quality.py)."""
    n_docs = len(documents)
    # On a handful of documents max_df * N can fall below min_df, which scikit-learn refuses;
    # min_df wins then.
    vectorizer = TfidfVectorizer(analyzer=segmenter.candidate_analyzer(ngram_max), lowercase=False,
                                 norm=None, smooth_idf=True, sublinear_tf=False,
                                 min_df=min_df, max_df=max(max_df, min_df / max(n_docs, 1)),
                                 dtype=np.float64)
    try:
        matrix = vectorizer.fit_transform(documents).tocsc()
    except ValueError:  # "After pruning, no terms remain" or "empty vocabulary"
        return []
    names = vectorizer.get_feature_names_out()
    idf = vectorizer.idf_
    df = np.diff(matrix.indptr)
    count = np.rint(np.asarray(matrix.sum(axis=0)).ravel() / idf).astype(np.int64)
    score = count / df * idf
    by_name = {name: i for i, name in enumerate(names)}
    shown = [segmenter.display(name) for name in names]
    # covered[side][j]: occurrences of candidate j inside its next longer candidate (extended
    # on that side) that scores at least as high; all of them covered = it is only ever a part
    covered = np.zeros((2, len(names)), dtype=np.int64)
    for i, name in enumerate(names):
        words = name.split(segmenter.key_sep)
        for side in (0, 1):
            j = _next_shorter_candidate(words, side, by_name, segmenter.key_sep)
            if j is not None and score[i] >= score[j] * (1 - 1e-12):
                covered[side, j] += count[i]
    keep = ~(covered == count).any(axis=0) & (count >= min_count) & (count >= min_mean_tf * df)
    keep &= np.array([_ONE_HAN.fullmatch(term) is None for term in shown], dtype=bool)
    order = sorted(np.flatnonzero(keep).tolist(), key=lambda i: (-score[i], shown[i]))
    chosen: list[int] = []
    for i in order:  # best first, so the check runs on about top_k candidates only
        if len(chosen) == top_k:
            break
        if fragment is None or not fragment(shown[i]):
            chosen.append(i)
    return [TermStats(shown[i], int(count[i]), int(df[i]), float(idf[i]), float(score[i]))
            for i in chosen]


def count_phrases(documents: Iterable[str], segmenter: Segmenter, terms: Iterable[str],
                  n_docs: int) -> dict[str, TermStats]:
    """Corpus count, df, idf and score of given terms (e.g. glossary terms), by the same analyzer.

    A term is found where a run of whole words reads as the term; Chinese words are
    compared by their concatenation, however jieba cut the text in between. A term the
    analyzer cannot read back whole ("C++" is the word "c", "80386" no word at all) gets
    count and df 0 rather than another term's figures; the text search still finds it
    (`train_occurrences`).
    """
    wanted: dict[str, list[str]] = {}
    out = {}
    n_max = 1
    for term in terms:
        words = [w for phrase in segmenter.phrases(term) for w in phrase]
        key = join_words(words, segmenter.sep)
        if not words or key.replace(" ", "") != normalize_term(term).replace(" ", ""):
            out[term] = TermStats(normalize_term(term), 0, 0, smooth_idf(0, n_docs), 0.0)
            continue
        wanted.setdefault(key, []).append(term)
        # in context jieba may cut a Chinese term into a few more words than alone
        n_max = max(n_max, len(words) + (2 if segmenter.key_sep != segmenter.sep else 0))
    count: Counter[str] = Counter()
    df: Counter[str] = Counter()
    analyze, display = segmenter.analyzer(n_max), segmenter.display
    for doc in documents:
        found = Counter(shown for g in analyze(doc) if (shown := display(g)) in wanted)
        count.update(found)
        df.update(found.keys())
    for key, same in wanted.items():
        idf = smooth_idf(df[key], n_docs)
        for term in same:
            out[term] = TermStats(key, count[key], df[key], idf,
                                  count[key] / df[key] * idf if df[key] else 0.0)
    return out
