"""Token frequencies, frequency buckets and rare domain terms (the `rare_terms` stage).

**Frequencies** are counted over the train split's token array chunk by chunk
(`np.bincount` per chunk of `rare.chunk_tokens` tokens), so memory is bounded
by the chunk and the vocabulary, not the corpus.

**Buckets.** Every vocabulary id gets one of FREQUENT (0), MEDIUM (1), RARE (2)
or UNSEEN (3, count 0 in train). Buckets are count ranges, so tokens with equal
counts always share a bucket (that is the whole tie rule):

* frequent: count >= c_f, where c_f is the count of the token at which the
  running share of occurrences, tokens taken from the most frequent down,
  first reaches `frequent_share` (so frequent tokens cover at least that share);
* rare: 0 < count <= c_r, where c_r is the largest count such that all seen
  tokens with count <= c_r together cover at most `rare_share` of occurrences;
* medium: every other seen token (c_r < count < c_f).

A bucket left empty by the thresholds is an error, never a silent empty group.

    >>> counts = np.array([0, 50, 30, 10, 5, 3, 2])   # 100 occurrences, id 0 unseen
    >>> bucket_tokens(counts, frequent_share=0.8, rare_share=0.1)[0].tolist()
    [3, 0, 0, 1, 2, 2, 2]

**Rare terms** are word n-grams (English) or jieba-word n-grams (Chinese),
1 to `rare.ngram_max` words long, that never cross punctuation or a digit.
Over the training documents scikit-learn's `TfidfVectorizer` (raw counts,
smooth idf = ln((1 + N) / (1 + df)) + 1 from this corpus, no normalisation)
gives each n-gram's TF-IDF in every document; a term's score is its mean
TF-IDF over the documents that contain it, i.e. (count / df) * idf: high for
a phrase that is rare in the corpus (idf) but repeated where it occurs.
Candidates must satisfy `min_df <= df <= max_df * N`, occur at least
`min_count` times, and `min_mean_tf` times per document that has them (domain
terms are bursty: a text that uses one tends to repeat it, while one-off
phrases occur once; 1.0 turns this off). An n-gram is dropped when every one
of its occurrences extends, on the same side, to a one-word-longer n-gram
that scores at least as high: it is only ever part of better terms
("nephrosclerosis" inside "bilateral nephrosclerosis"; Chinese "利率私募债"
inside "浮动利率私募债" and "固定利率私募债"). At most `top_k` terms are kept,
best score first (ties by term, alphabetically). TF-IDF runs on at most
`rare.max_documents` training documents, every k-th one (its vocabulary of
n-grams is what takes memory); token counts always cover the whole split.
Terms of the user glossary (`rare.glossary`) are always kept, and Chinese
segmentation treats them as single words so they stay whole.

    >>> ngrams(["chronic", "renal", "failure"], 2, " ")
    ['chronic', 'renal', 'failure', 'chronic renal', 'renal failure']
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

from rarelm.errors import RarelmError
from rarelm.files import load_array

FREQUENT, MEDIUM, RARE, UNSEEN = 0, 1, 2, 3
BUCKET_NAMES = ("frequent", "medium", "rare", "unseen")


# ---------------------------------------------------------------- frequencies and buckets


def count_tokens(tokens: np.ndarray, vocab_size: int, chunk_tokens: int) -> np.ndarray:
    """Occurrences of every id in `tokens`, int64 [vocab_size], counted chunk by chunk."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for start in range(0, len(tokens), chunk_tokens):
        chunk = np.asarray(tokens[start:start + chunk_tokens])
        found = np.bincount(chunk, minlength=vocab_size)
        if len(found) > vocab_size:
            bad = int(chunk.max())
            raise RarelmError(
                f"token id {bad} in the train split is outside the vocabulary of {vocab_size} "
                "ids: the tokenized data and its tokenizer do not match; re-run the tokenize stage")
        counts += found
    return counts


def bucket_tokens(counts: np.ndarray, frequent_share: float, rare_share: float) -> tuple[np.ndarray, dict]:
    """Buckets (int8 [vocab]) by the count-range rule of the module docstring, and a summary."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        raise RarelmError("rare_terms: the train split has no tokens to count")
    seen = np.sort(counts[counts > 0])  # ascending
    running_desc = np.cumsum(seen[::-1])
    # first position (from the top) where the running share reaches frequent_share
    at = int(np.searchsorted(running_desc, frequent_share * total, side="left"))
    frequent_min = int(seen[::-1][min(at, len(seen) - 1)])
    # occurrences of all tokens with count <= c, for each distinct count c (ascending)
    levels, first = np.unique(seen, return_index=True)
    covered = np.cumsum(seen)[np.r_[first[1:], len(seen)] - 1]
    within = levels[covered <= rare_share * total]
    rare_max = int(within[-1]) if len(within) else 0

    buckets = np.full(len(counts), MEDIUM, dtype=np.int8)
    buckets[counts >= frequent_min] = FREQUENT
    buckets[(counts > 0) & (counts <= rare_max)] = RARE
    buckets[counts == 0] = UNSEEN
    summary = {"total_occurrences": total, "vocab_size": int(len(counts)),
               "frequent_min_count": frequent_min, "rare_max_count": rare_max}
    for code, name in enumerate(BUCKET_NAMES):
        members = buckets == code
        summary[name] = {"tokens": int(members.sum()),
                         "occurrences": int(counts[members].sum()),
                         "share": float(counts[members].sum() / total)}
    for code in (FREQUENT, MEDIUM, RARE):
        if summary[BUCKET_NAMES[code]]["tokens"] == 0:
            raise RarelmError(
                f"rare: frequent_share = {frequent_share:g} and rare_share = {rare_share:g} leave the "
                f"{BUCKET_NAMES[code]} bucket empty (counts range {int(seen[0])}..{int(seen[-1])}); "
                + ("raise rare_share" if code == RARE else
                   "lower frequent_share or rare_share" if code == MEDIUM else "raise frequent_share"))
    return buckets, summary


# ---------------------------------------------------------------- words and n-grams

# A phrase never crosses punctuation, a symbol or a digit: split the text there.
_BOUNDARY = re.compile(r"[^\w\s'-]+|[\d_]+")
_EN_WORD = re.compile(r"[^\W\d_]+(?:['-][^\W\d_]+)*")
_ASCII_WORD_END = re.compile(r"[A-Za-z0-9]")


def normalize_term(term: str) -> str:
    """The form terms are compared in: NFC, lower case, single spaces."""
    return " ".join(unicodedata.normalize("NFC", term).lower().split())


def join_words(words: list[str], sep: str) -> str:
    """Words joined by `sep`; with sep "" (Chinese) two Latin words still get a space."""
    if sep or len(words) < 2:
        return sep.join(words)
    out = words[0]
    for word in words[1:]:
        gap = _ASCII_WORD_END.match(out[-1]) and _ASCII_WORD_END.match(word[0])
        out += (" " if gap else "") + word
    return out


def ngrams(words: list[str], n_max: int, sep: str) -> list[str]:
    """All n-grams of `words`, n = 1..n_max, shortest first (see the module docstring)."""
    out = []
    for n in range(1, n_max + 1):
        out.extend(join_words(words[i:i + n], sep) for i in range(len(words) - n + 1))
    return out


_JIEBA_BASE = None


def _fresh_jieba():
    """A private jieba.Tokenizer with the default dictionary, loaded from disk once per process.

    Private so glossary words added to it never leak into other users of jieba;
    copied from a loaded one because loading the dictionary takes seconds.
    """
    global _JIEBA_BASE
    import logging

    import jieba

    jieba.setLogLevel(logging.WARNING)
    if _JIEBA_BASE is None:
        _JIEBA_BASE = jieba.Tokenizer()
        _JIEBA_BASE.initialize()
    tokenizer = jieba.Tokenizer()
    tokenizer.FREQ, tokenizer.total = dict(_JIEBA_BASE.FREQ), _JIEBA_BASE.total
    tokenizer.initialized = True
    return tokenizer


class Segmenter:
    """Text -> phrases (lists of words) that n-grams stay inside.

    English: lower-cased words of letters (with inner ' and -). Chinese: jieba
    words, from a private jieba.Tokenizer that knows the glossary terms as words.
    """

    def __init__(self, language: str, glossary: Iterable[str] = ()):
        self.language = language
        self.sep = "" if language == "zh" else " "  # between words of a term as shown
        # between words of an n-gram key: Chinese keys keep their word boundaries, since
        # jieba may cut the concatenated string differently from the same text in context
        self.key_sep = "\x1f" if language == "zh" else " "
        self._jieba = None
        if language == "zh":
            self._jieba = _fresh_jieba()
            for term in glossary:
                # glossary terms are whole words: one word, with a frequency that wins
                self._jieba.add_word(normalize_term(term).replace(" ", ""), freq=10**6)

    def phrases(self, text: str) -> Iterator[list[str]]:
        for part in _BOUNDARY.split(unicodedata.normalize("NFC", text).lower()):
            if self._jieba is None:
                words = _EN_WORD.findall(part)
            else:
                words = [w for w in self._jieba.lcut(part) if w.strip()]
            if words:
                yield words

    def analyzer(self, n_max: int) -> Callable[[str], list[str]]:
        """A scikit-learn analyzer: document -> its n-gram keys (n = 1..n_max)."""
        return lambda text: [g for words in self.phrases(text) for g in ngrams(words, n_max, self.key_sep)]

    def display(self, key: str) -> str:
        """An n-gram key as a term: "质押\x1f式\x1f回购" -> "质押式回购"."""
        return key if self.key_sep == self.sep else join_words(key.split(self.key_sep), self.sep)


# ---------------------------------------------------------------- TF-IDF terms


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


def tfidf_terms(documents: list[str], segmenter: Segmenter, ngram_max: int, min_df: int,
                max_df: float, min_count: int, min_mean_tf: float, top_k: int) -> list[TermStats]:
    """The `top_k` TF-IDF terms of `documents`, best first (scoring in the module docstring)."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    n_docs = len(documents)
    # On a handful of documents max_df * N can fall below min_df, which scikit-learn refuses;
    # min_df wins then.
    vectorizer = TfidfVectorizer(analyzer=segmenter.analyzer(ngram_max), lowercase=False,
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
    # covered[side][j]: occurrences of n-gram j inside a one-word-longer n-gram (extended on
    # that side) that scores at least as high; all of them covered = it is only ever a part
    covered = np.zeros((2, len(names)), dtype=np.int64)
    for i, name in enumerate(names):
        words = name.split(segmenter.key_sep)
        if len(words) < 2:
            continue
        for side, part in enumerate((words[1:], words[:-1])):
            j = by_name.get(segmenter.key_sep.join(part))
            if j is not None and score[i] >= score[j] * (1 - 1e-12):
                covered[side, j] += count[i]
    keep = ~(covered == count).any(axis=0) & (count >= min_count) & (count >= min_mean_tf * df)
    order = sorted(np.flatnonzero(keep).tolist(), key=lambda i: (-score[i], shown[i]))
    return [TermStats(shown[i], int(count[i]), int(df[i]), float(idf[i]), float(score[i]))
            for i in order[:top_k]]


def count_phrases(documents: Iterable[str], segmenter: Segmenter, terms: Iterable[str],
                  n_docs: int) -> dict[str, TermStats]:
    """Corpus count, df, idf and score of given terms (e.g. glossary terms), by the same analyzer.

    A term is found where a run of whole words reads as the term; Chinese words are
    compared by their concatenation, however jieba cut the text in between.
    """
    wanted: dict[str, str] = {}
    n_max = 1
    for term in terms:
        words = [w for phrase in segmenter.phrases(term) for w in phrase]
        if words:
            wanted[join_words(words, segmenter.sep)] = term
            # in context jieba may cut a Chinese term into a few more words than alone
            n_max = max(n_max, len(words) + (2 if segmenter.key_sep != segmenter.sep else 0))
    count: Counter[str] = Counter()
    df: Counter[str] = Counter()
    analyze, display = segmenter.analyzer(n_max), segmenter.display
    for doc in documents:
        found = Counter(shown for g in analyze(doc) if (shown := display(g)) in wanted)
        count.update(found)
        df.update(found.keys())
    out = {}
    for key, term in wanted.items():
        idf = smooth_idf(df[key], n_docs)
        out[term] = TermStats(key, count[key], df[key], idf,
                              count[key] / df[key] * idf if df[key] else 0.0)
    return out


# ---------------------------------------------------------------- glossaries and scoring


def read_glossary(path: str | Path) -> list[str]:
    """A user glossary: one term per line (UTF-8); blank lines and duplicates are skipped."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except FileNotFoundError:
        raise RarelmError(f"rare.glossary: no such file: {path}") from None
    except UnicodeDecodeError as exc:
        raise RarelmError(f"rare.glossary: {path} is not valid UTF-8 (byte {exc.start}); "
                          "save it as UTF-8, one term per line") from None
    terms = list(dict.fromkeys(t for line in text.splitlines() if (t := " ".join(line.split()))))
    if not terms:
        raise RarelmError(f"rare.glossary: {path} holds no term (one term per line, UTF-8)")
    return terms


def read_reference(path: str | Path) -> list[str]:
    """A reference glossary: a TSV with a header whose first column is `term`, or one term per line."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
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


def term_token_ids(tokenizer, term: str) -> list[list[int]]:
    """The token-id sequences of `term`: as is and after a space (byte-level BPE), deduplicated."""
    variants = []
    for text in (term, " " + term):
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        if ids and ids not in variants:
            variants.append(ids)
    return variants


# ---------------------------------------------------------------- the stage


def training_documents(prepared_dir: Path, n_train: int, max_documents: int) -> list[str]:
    """The train split's documents, or `max_documents` of them evenly spread (bounds TF-IDF memory)."""
    from rarelm.corpus import read_split

    stride = max(1, math.ceil(n_train / max_documents))
    return [doc for i, doc in enumerate(read_split(prepared_dir, "train")) if i % stride == 0]


def load_tokenizer(tokenizer_dir: Path, vocab_size: int):
    """The pipeline's tokenizer (tokenizers.Tokenizer), checked against the tokenized data."""
    from tokenizers import Tokenizer

    path = tokenizer_dir / "tokenizer.json"
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a plain Exception for a missing or bad file
        raise RarelmError(f"{path}: not a readable tokenizer ({' '.join(str(exc).split())[:200]}); "
                          "re-run the tokenize stage") from None
    if tokenizer.get_vocab_size() != vocab_size:
        raise RarelmError(
            f"{path}: vocabulary of {tokenizer.get_vocab_size()} tokens, but the tokenized data "
            f"says {vocab_size}; the vocabulary does not match the tokenized data, re-run tokenize")
    return tokenizer


def rare_terms(params, reference_glossary: str, prepared_dir: Path, tokenized_dir: Path,
               out_dir: Path) -> dict:
    """Run the whole stage into out_dir (see stages/rare_terms.py); returns the metrics.

    `params` is RareParams. Everything is read and checked before the first file is written.
    """
    from rarelm.data import TokenizedData
    from rarelm.files import read_json, write_json

    data = TokenizedData.open(tokenized_dir)
    tokenizer = load_tokenizer(data.tokenizer_dir, data.vocab_size)
    glossary = read_glossary(params.glossary) if params.glossary else []
    reference = read_reference(reference_glossary) if reference_glossary else []
    try:
        stats = read_json(prepared_dir / "stats.json")
    except FileNotFoundError:
        raise RarelmError(f"{prepared_dir}: no stats.json; run the prepare stage first") from None

    counts = count_tokens(data.tokens("train"), data.vocab_size, params.chunk_tokens)
    buckets, bucket_summary = bucket_tokens(counts, params.frequent_share, params.rare_share)

    language = stats["language"]
    documents = training_documents(prepared_dir, stats["train"]["documents"], params.max_documents)
    segmenter = Segmenter(language, glossary)
    extracted = tfidf_terms(documents, segmenter, params.ngram_max, params.min_df, params.max_df,
                            params.min_count, params.min_mean_tf, params.top_k)
    from_glossary = count_phrases(documents, segmenter, glossary, len(documents))

    rows: dict[str, dict] = {}
    for term, st in from_glossary.items():
        rows[normalize_term(term)] = {"term": term, "source": "glossary", **_numbers(st)}
    for st in extracted:
        rows.setdefault(normalize_term(st.term), {"term": st.term, "source": "tfidf", **_numbers(st)})
    table = sorted(rows.values(), key=lambda r: (r["source"] != "glossary", -r["score"], r["term"]))
    for row in table:
        row["token_ids"] = term_token_ids(tokenizer, row["term"])

    metrics = {"language": language, "documents": len(documents),
               "terms": len(table), "tfidf_terms": len(extracted), "glossary_terms": len(glossary),
               "buckets": {name: {k: bucket_summary[name][k] for k in ("tokens", "share")}
                           for name in BUCKET_NAMES}}
    if reference:
        metrics["extraction"] = extraction_scores([st.term for st in extracted], reference)
        in_train = count_phrases(documents, segmenter, reference, len(documents))
        # recall cannot exceed this: reference terms that occur in the training documents at all
        metrics["extraction"]["reference_in_train"] = sum(st.df > 0 for st in in_train.values())

    np.save(out_dir / "counts.npy", counts)
    np.save(out_dir / "buckets.npy", buckets)
    write_json(out_dir / "buckets.json", bucket_summary)
    with open(out_dir / "terms.jsonl", "w", encoding="utf-8", newline="\n") as f:
        for row in table:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    write_json(out_dir / "summary.json", metrics)
    return metrics


def _numbers(st: TermStats) -> dict:
    return {"count": st.count, "df": st.df, "idf": round(st.idf, 6), "score": round(st.score, 6)}


_VOCAB_MISMATCH = "for this tokenized data; it does not match the vocabulary"


def load_buckets(rare_dir: str | Path, vocab_size: int) -> np.ndarray:
    """data/rare/buckets.npy (int8 [vocab_size], FREQUENT..UNSEEN), checked against the vocabulary."""
    return load_array(Path(rare_dir) / "buckets.npy", np.int8, vocab_size, "rare_terms", _VOCAB_MISMATCH)


def load_counts(rare_dir: str | Path, vocab_size: int) -> np.ndarray:
    """data/rare/counts.npy (int64 [vocab_size]), checked against the vocabulary."""
    return load_array(Path(rare_dir) / "counts.npy", np.int64, vocab_size, "rare_terms", _VOCAB_MISMATCH)
