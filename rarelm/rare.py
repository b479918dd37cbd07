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
1 to `rare.ngram_max` words long, that never cross punctuation or a digit and
that may be terms by these rules (docs/extraction.md gives the reasons and
what they did to real text):

1. No function word at an edge. English: scikit-learn's ENGLISH_STOP_WORDS,
   less the content words in it ("system", "call", "interest"...). Chinese: by
   jieba's dictionary tag (prepositions, particles, conjunctions; one-character
   adverbs, pronouns, positions, classifiers) and a list of function words.
   Inside a term only a linking word may sit (English "of", "for", "in", "on",
   "to", "at", "by", "per", "and"; Chinese prepositions and the like, which
   jieba often cuts out of a compound); any other stop word, a Chinese particle
   (的 了) or conjunction (和 或), a contraction ("it's", "don't") and an example
   placeholder ("foo", "frotz") split the phrase as punctuation does.
2. No punctuation, hyphen or quote at an edge (jieba keeps "-", "--", "'" as
   words; a quote splits).
3. No Latin fragment: one lower-case letter splits; two lower-case letters
   ("dx"), a possessive ("user's") or a placeholder like "xxxx" sit inside
   only; one or two capitals (an acronym or a named letter: "CT", "D") may
   edge a term only beside a longer word ("CT scan", "vitamin D", "B超"), never
   stand alone. A Latin token with a digit or an underscore ("IPv6", "64-bit",
   "st_mode", "dir/file1") is skipped whole, so no piece of it ("ipv") is a term.
4. A term shows the text between its words as written: nothing, or a space
   between two Latin words. Chinese "将 command" never becomes "将command",
   "bash-doc 包" never "-doc包"; English "the string 'cfg'" never "string cfg".

    >>> seg = Segmenter("en")
    >>> [seg.display(k) for k in seg.candidate_analyzer(4)("Return a copy of the CT scan to p.")]
    ['return', 'copy', 'scan', 'ct scan']

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
best score first (ties by term, alphabetically). TF-IDF runs on at most
`rare.max_documents` training documents, every k-th one (its vocabulary of
n-grams is what takes memory); token counts always cover the whole split.
Terms of the user glossary (`rare.glossary`) are always kept as given, none
of the rules above applies to them, and Chinese segmentation treats them as
single words so they stay whole.

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
from rarelm.train.checkpoint import sha256_file

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
_HAN = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")

# Words of scikit-learn's ENGLISH_STOP_WORDS that head real terms ("system call", "interest
# rate", "bill of materials"): content words here.
_CONTENT_WORDS_IN_STOP_LIST = frozenset(
    "amount back bill bottom call detail empty fire front full interest mill name part side "
    "system thick thin top".split())
# The stop words that may join the words of a term ("point of care", "research and
# development"): the one preposition of Justeson and Katz's noun-phrase pattern, or "and".
_ENGLISH_LINKERS = frozenset("of for in on to at by per and".split())
_CLITIC = re.compile(r"'(?:s|t|re|ll|ve|d|m)$")  # user's, don't, we'll
# Metasyntactic placeholders of examples ("branch foo", "git frotz"): never in a term.
_PLACEHOLDERS = frozenset("foo baz qux quux foobar frotz nitfol xyzzy".split())
# A Latin token (a path too) with a digit or an underscore ("IPv6", "64-bit", "st_mode",
# "dir/file1"): the digit boundary would leave pieces of it ("ipv", "bit", "st", "dir"), so
# candidates skip the whole token.
_TOKEN_WITH_DIGIT = re.compile(
    r"(?<![A-Za-z\u00c0-\u024f'./-])[A-Za-z\u00c0-\u024f'./-]*+[\d_][A-Za-z\u00c0-\u024f\d_'./-]*")
# Chinese function words. Particles (jieba tags u*: 的 了 着), conjunctions (c: 和 或 如果)
# and the longer function words named below (一个 所有 已经 用于) never sit in a term.
# Prepositions (p: 将 对 从), modal particles (y), interjections (e), onomatopoeia (o),
# one-character adverbs (d: 也 不), pronouns (r: 这 该), positions (f: 中 上) and classifiers
# (q: 个 次), and the one-character words named below (是 有 到), never start or end one; they
# may sit inside, where jieba often cuts them out of a compound (可回售票据: 可回/售票/据).
# Longer words of tags d, r, f often begin real terms (一次性 d, 本地 r, 前端 f), so only the
# function words among them are named, with grammatical verbs and numerals.
_ZH_SPLIT_TAGS = frozenset("u uj ul uz ug uv ud c".split())
_ZH_SPLIT_WORDS = frozenset(
    "一个 一些 一种 两个 几个 许多 很多 若干 一次 这个 那个 这些 那些 这样 那样 这种 那种 这里 "
    "那里 所有 任何 某些 各种 其他 其它 其中 之前 之后 之间 之中 之外 以上 以下 本次 此次 这次 "
    "每个 每次 各个 各项 某种 一切 有些 别的 其余 已经 必须 可能 应该 能够 没有 需要 通常 首先 "
    "如何 什么 怎么 正在 分别 一直 非常 比较 仍然 经常 进行 用于 位于 属于 作为 成为 包括 例如 "
    "比如 还有 使得".split())
_ZH_INNER_TAGS = frozenset("p y e o".split())
_ZH_ONE_CHAR_INNER_TAGS = frozenset("d r f q".split())
_ZH_INNER_WORDS = frozenset("是 有 到 来 会 能 要 应 没 使 让 如 即 且 像 很 每 此 往 一 二 两 三 四 五 六 "
                            "七 八 九 十 几 种".split())
# What a word may be in a candidate term (rules 1 to 3 of the module docstring).
SPLIT, INNER, EDGE, LETTERS = "split", "inner", "edge", "letters"
_STOP_WORDS: frozenset[str] | None = None
_WORD_TAGS: dict[str, str] | None = None


def _english_stop_words() -> frozenset[str]:
    global _STOP_WORDS
    if _STOP_WORDS is None:
        from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

        _STOP_WORDS = frozenset(ENGLISH_STOP_WORDS - _CONTENT_WORDS_IN_STOP_LIST)
    return _STOP_WORDS


def _jieba_word_tags() -> dict[str, str]:
    """jieba's dictionary part-of-speech tag of every word it knows (loaded once per process)."""
    global _WORD_TAGS
    if _WORD_TAGS is None:
        import logging

        import jieba
        import jieba.posseg

        jieba.setLogLevel(logging.WARNING)
        _WORD_TAGS = jieba.posseg.dt.word_tag_tab
    return _WORD_TAGS


def latin_word_role(word: str, as_written: str) -> str:
    """SPLIT, INNER, EDGE or LETTERS: what a Latin-letter word may be in a term.

    A stop word splits (the phrase is cut there, as at punctuation), unless it is a linker,
    which may only sit inside; a contraction counts as its first part ("it's" as "it") and
    any "n't" as "not". So does one lower-case letter (a variable, an option: "-m").
    A possessive, a lower-case fragment of two letters ("dx"), a placeholder of one
    repeated letter ("xxxx") or a word that does not begin and end with a letter only sit
    inside. One or two capitals are LETTERS: an acronym or a named letter, an edge only
    beside a longer word ("CT scan", "vitamin D", not "D G").

    >>> [latin_word_role(w.lower(), w) for w in ["the", "of", "it's", "p", "user's", "dx", "CT", "gout"]]
    ['split', 'inner', 'split', 'split', 'inner', 'inner', 'letters', 'edge']
    """
    if word.split("'")[0] in _english_stop_words() or word.endswith("n't"):
        return INNER if word in _ENGLISH_LINKERS else SPLIT
    if word in _PLACEHOLDERS:
        return SPLIT
    if len(word) <= 2:
        return LETTERS if as_written.isupper() else SPLIT if len(word) == 1 else INNER
    if _CLITIC.search(word) or len(set(word)) == 1 or not (word[0].isalpha() and word[-1].isalpha()):
        return INNER
    return EDGE


def chinese_word_role(word: str) -> str:
    """SPLIT, INNER or EDGE: what a Chinese word may be in a term (function words above).

    >>> [chinese_word_role(w) for w in ["的", "和", "一个", "将", "中", "本地", "文件"]]
    ['split', 'split', 'split', 'inner', 'inner', 'edge', 'edge']
    """
    tag = _jieba_word_tags().get(word)
    if tag in _ZH_SPLIT_TAGS or word in _ZH_SPLIT_WORDS:
        return SPLIT
    one_char_function_word = len(word) == 1 and tag in _ZH_ONE_CHAR_INNER_TAGS
    if word in _ZH_INNER_WORDS or tag in _ZH_INNER_TAGS or one_char_function_word:
        return INNER
    return EDGE


NEVER, OF_LONGER, ALWAYS = 0, 1, 2  # whether a word may start or end a term


def edge_kinds(roles: list[str]) -> list[int]:
    """Whether each word of a run (given their roles) may start or end a term: EDGE words
    ALWAYS, LETTERS beside an EDGE word only a term OF_LONGER words ("CT scan", not "CT").

    >>> edge_kinds([LETTERS, LETTERS, EDGE, LETTERS, INNER])
    [0, 1, 2, 1, 0]
    """
    kinds = [ALWAYS if role == EDGE else NEVER for role in roles]
    for i, role in enumerate(roles):
        if role == LETTERS and EDGE in roles[max(i - 1, 0):i + 2]:
            kinds[i] = OF_LONGER
    return kinds


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


def ngrams(words: list[str], n_max: int, sep: str, edges: list[int] | None = None) -> list[str]:
    """All n-grams of `words`, n = 1..n_max, shortest first (see the module docstring);
    with `edges` (see edge_kinds) only those whose first and last words may be edges.

    >>> ngrams(["failure", "of", "the", "kidney"], 4, " ", [ALWAYS, NEVER, NEVER, ALWAYS])
    ['failure', 'kidney', 'failure of the kidney']
    >>> ngrams(["ct", "scan"], 2, " ", [OF_LONGER, ALWAYS])
    ['scan', 'ct scan']
    """
    if edges is None:
        edges = [ALWAYS] * len(words)
    out = [word for word, edge in zip(words, edges, strict=True) if edge == ALWAYS]
    for n in range(2, n_max + 1):
        for i in range(len(words) - n + 1):
            if edges[i] and edges[i + n - 1]:
                out.append(join_words(words[i:i + n], sep))
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
        self._roles: dict[str, str] = {}  # word as written -> its role, once per word
        if language == "zh":
            self._jieba = _fresh_jieba()
            for term in glossary:
                # glossary terms are whole words: one word, with a frequency that wins
                self._jieba.add_word(normalize_term(term).replace(" ", ""), freq=10**6)

    def phrases(self, text: str) -> Iterator[list[str]]:
        for phrase in self._written_phrases(text):
            yield [word for word, _, _ in phrase]

    def _written_phrases(self, text: str) -> Iterator[list[tuple[str, str, str]]]:
        """Phrases of (word, the word as written, the text between it and the word before)."""
        text = unicodedata.normalize("NFC", text).replace("\u2019", "'")  # ’ as in "user’s"
        for part in _BOUNDARY.split(text):
            phrase = self._english_words(part) if self._jieba is None else self._jieba_words(part)
            if phrase:
                yield phrase

    @staticmethod
    def _english_words(part: str) -> list[tuple[str, str, str]]:
        out, end = [], 0
        for match in _EN_WORD.finditer(part):
            out.append((match[0].lower(), match[0], part[end:match.start()] if out else ""))
            end = match.end()
        return out

    def _jieba_words(self, part: str) -> list[tuple[str, str, str]]:
        lower = part.lower()
        same_length = len(lower) == len(part)  # else (rare) the written form is not known
        out, gap = [], ""
        for word, start, end in self._jieba.tokenize(lower):
            if not word.strip():
                gap += word
                continue
            out.append((word, part[start:end] if same_length else word, gap if out else ""))
            gap = ""
        return out

    def word_role(self, word: str, as_written: str) -> str:
        """What a word may be in a term: SPLIT, INNER, EDGE or LETTERS (see latin_word_role)."""
        role = self._roles.get(as_written)
        if role is None:
            role = self._roles[as_written] = self._find_role(word, as_written)
        return role

    def _find_role(self, word: str, as_written: str) -> str:
        if self._jieba is not None and _HAN.search(word):
            return chinese_word_role(word)
        if not (word[0].isalpha() and word[-1].isalpha()):  # jieba's "-", "--", "'"
            return SPLIT if "'" in word else INNER  # a quote, or a hyphen as in "bash-doc"
        return latin_word_role(word, as_written)

    def candidate_runs(self, text: str) -> Iterator[tuple[list[str], list[int]]]:
        """(words, edge kinds) of the stretches that candidate terms stay inside.

        A phrase, cut at words that split (rules 1 to 3), at Latin tokens with a digit or an
        underscore (rule 3: "IPv6", "st_mode") and where the term would not show the text
        between two words as written (rule 4: Chinese "将 command" never becomes "将command",
        English "the string 'cfg'" never "string cfg").
        """
        for phrase in self._written_phrases(_TOKEN_WITH_DIGIT.sub("|", text)):
            words: list[str] = []
            roles: list[str] = []
            for word, written, gap in phrase:
                role = self.word_role(word, written)
                if words and (role == SPLIT or not self._joins_as_written(words[-1], word, gap)):
                    yield words, edge_kinds(roles)
                    words, roles = [], []
                if role != SPLIT:
                    words.append(word)
                    roles.append(role)
            if words:
                yield words, edge_kinds(roles)

    def _joins_as_written(self, before: str, after: str, gap: str) -> bool:
        """Whether a term joins two words as the text does: `gap` is nothing where the term
        shows nothing (join_words), white space where it shows a space."""
        if self.sep == " " or (_ASCII_WORD_END.match(before[-1]) and _ASCII_WORD_END.match(after[0])):
            return gap.isspace()
        return not gap

    def analyzer(self, n_max: int) -> Callable[[str], list[str]]:
        """A scikit-learn analyzer: document -> all its n-gram keys (n = 1..n_max)."""
        return lambda text: [g for words in self.phrases(text) for g in ngrams(words, n_max, self.key_sep)]

    def candidate_analyzer(self, n_max: int) -> Callable[[str], list[str]]:
        """Like `analyzer`, but only the n-grams that may be terms (rules of the module docstring)."""
        return lambda text: [g for words, edges in self.candidate_runs(text)
                             for g in ngrams(words, n_max, self.key_sep, edges)]

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
                max_df: float, min_count: int, min_mean_tf: float, top_k: int) -> list[TermStats]:
    """The `top_k` TF-IDF terms of `documents`, best first (scoring in the module docstring)."""
    from sklearn.feature_extraction.text import TfidfVectorizer

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

    metrics = {"language": language, "documents": len(documents),
               "terms": len(table), "tfidf_terms": len(extracted), "glossary_terms": len(glossary),
               "buckets": {name: {k: bucket_summary[name][k] for k in ("tokens", "share")}
                           for name in BUCKET_NAMES}}
    if reference:
        metrics["extraction"] = extraction_scores([st.term for st in extracted], reference)
        in_train = count_phrases(documents, segmenter, reference, len(documents))
        # recall cannot exceed this: reference terms that occur in the training documents at all
        metrics["extraction"]["reference_in_train"] = sum(st.df > 0 for st in in_train.values())

    index, forms = build_term_index(tokenizer, prepared_dir, data, [row["term"] for row in table])
    found = np.bincount(index[:, 2], minlength=len(table))
    for row, n, written in zip(table, found.tolist(), forms, strict=True):
        display = display_form(row["term"], written)
        row["token_ids"] = term_token_ids(tokenizer, display)
        row["train_occurrences"] = n  # in the whole train split, by the search evaluate uses
        row["display"] = display  # the term as it is written most often in train
        row["surface_forms"] = surface_forms(written)  # every way train writes it, with counts
    metrics["term_occurrences"] = int(len(index))
    metrics["terms_found_in_train"] = int((found > 0).sum())

    np.save(out_dir / "counts.npy", counts)
    np.save(out_dir / "buckets.npy", buckets)
    write_json(out_dir / "buckets.json", bucket_summary)
    with open(out_dir / "terms.jsonl", "w", encoding="utf-8", newline="\n") as f:
        for row in table:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    np.save(out_dir / TERM_INDEX, index)
    write_json(out_dir / TERM_INDEX_META, term_index_meta(index, len(table), data, out_dir))
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

def log_prior(counts: np.ndarray) -> np.ndarray:
    """log pi: the train unigram prior with add-one smoothing, float64 [vocab_size].

    pi_v = (count_v + 1) / (N + V), so a token never seen in train has a finite log prior
    (logit adjustment subtracts or adds tau * log pi, which must not be infinite).

    >>> np.round(log_prior(np.array([3, 0, 1])), 4).tolist()  # (4, 1, 2) / 7
    [-0.5596, -1.9459, -1.2528]
    """
    counts = np.asarray(counts, dtype=np.float64)
    return np.log(counts + 1.0) - np.log(counts.sum() + len(counts))



# ---------------------------------------------------------------- where terms occur in the train split

TERM_INDEX = "term_index.npy"
TERM_INDEX_META = "term_index.json"


def build_term_index(tokenizer, prepared_dir: Path, data, terms: list[str],
                     batch_documents: int = 5000) -> tuple[np.ndarray, list[Counter[str]]]:
    """Every occurrence of every term in the train split, int64 [occurrences, 3], sorted,
    and each term's surface forms: how often it is written each way.

    A row is (start, length, term): the split position of the first token that
    covers the occurrence, how many tokens cover it, and the term's line in
    terms.jsonl. Occurrences are found by `term_search.find_occurrences`, the
    search `evaluate` uses (whatever the case, word-boundary aware, in the text,
    mapped to tokens by the tokenizer's offsets), `batch_documents` documents at
    a time, so memory is bounded by that batch plus the index itself (24 bytes
    per occurrence).

        document " acute MI. Subacute MI. Acute mi"  tokens | acute| MI|.| Sub|acute| MI|.| Acute| mi|
        term "acute mi" (term 0)  -> rows (0, 2, 0) and (7, 2, 0); forms {"acute MI": 1, "Acute mi": 1}
    """
    from rarelm.corpus import read_split
    from rarelm.term_search import Term, find_occurrences

    tokens, offsets = data.tokens("train"), data.offsets("train")
    wanted = [Term(text, 0) for text in terms]
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


class TermIndex:
    """data/rare/term_index.npy, memory-mapped: which train positions belong to term occurrences.

    `open` checks that it was built from the current terms.jsonl, tokenizer and
    train split. Lookups touch only the rows near the positions asked about.

        >>> index = TermIndex(np.array([[2, 2, 0], [9, 1, 1]]), max_length=2)
        >>> index.target_mask(np.array([0, 8]), block_size=4).astype(int).tolist()
        [[0, 1, 1, 0], [1, 0, 0, 0]]
    """

    def __init__(self, rows: np.ndarray, max_length: int, n_terms: int | None = None):
        self.rows = rows
        self.starts = rows[:, 0]
        self.max_length = max_length
        self.n_terms = int(rows[:, 2].max(initial=-1)) + 1 if n_terms is None else n_terms

    @classmethod
    def open(cls, rare_dir: str | Path, data) -> TermIndex:
        from rarelm.files import read_json

        rare_dir = Path(rare_dir)
        try:
            meta = read_json(rare_dir / TERM_INDEX_META)
            rows = np.load(rare_dir / TERM_INDEX, mmap_mode="r")
        except (FileNotFoundError, ValueError, OSError):
            raise RarelmError(f"{rare_dir}: no readable {TERM_INDEX} (where terms occur in the train "
                              "split); re-run the rare_terms stage") from None
        stale = [what for what, ok in (
            ("terms.jsonl", (rare_dir / "terms.jsonl").is_file()
             and meta.get("terms_sha256") == sha256_file(rare_dir / "terms.jsonl")),
            ("tokenizer", meta.get("tokenizer_sha256") == sha256_file(data.tokenizer_dir / "tokenizer.json")),
            ("train split", meta.get("train_tokens") == int(data.meta["splits"]["train"]["tokens"])),
            ("row count", rows.ndim == 2 and rows.shape[1] == 3 and len(rows) == meta.get("occurrences")),
        ) if not ok]
        if stale:
            raise RarelmError(f"{rare_dir}/{TERM_INDEX} was not built from the current {stale[0]}; "
                              "re-run the rare_terms stage")
        return cls(rows, int(meta["max_length"]), int(meta["terms"]))

    def __len__(self) -> int:
        return len(self.rows)

    def overlapping(self, lo: int, hi: int) -> np.ndarray:
        """Rows of the occurrences that cover any position in [lo, hi)."""
        first = int(np.searchsorted(self.starts, lo - self.max_length + 1, side="left"))
        last = int(np.searchsorted(self.starts, hi, side="left"))
        rows = np.asarray(self.rows[first:last])
        return rows[rows[:, 0] + rows[:, 1] > lo]

    def target_mask(self, starts: np.ndarray, block_size: int) -> np.ndarray:
        """Bool [windows, block_size]: target j of the window starting at s (position s + 1 + j)
        is a token of a term occurrence."""
        mask = np.zeros((len(starts), block_size + 1), dtype=np.int8)
        for w, s in enumerate(np.asarray(starts, dtype=np.int64).tolist()):
            for start, length, _ in self.overlapping(s + 1, s + 1 + block_size).tolist():
                a, b = max(start, s + 1) - s - 1, min(start + length, s + 1 + block_size) - s - 1
                mask[w, a] += 1
                mask[w, b] -= 1
        return np.cumsum(mask[:, :-1], axis=1) > 0

    def occurrences_per_term(self, chunk_rows: int = 1 << 22) -> np.ndarray:
        """How often each term occurs in the train split, int64 [n_terms]."""
        out = np.zeros(self.n_terms, dtype=np.int64)
        for lo in range(0, len(self.rows), chunk_rows):
            out += np.bincount(np.asarray(self.rows[lo:lo + chunk_rows, 2]), minlength=self.n_terms)
        return out
