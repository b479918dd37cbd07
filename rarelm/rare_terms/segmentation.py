"""Text -> words -> the n-grams that may be rare domain terms (the `rare_terms` stage).

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

    >>> ngrams(["chronic", "renal", "failure"], 2, " ")
    ['chronic', 'renal', 'failure', 'chronic renal', 'renal failure']
"""

from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator

import jieba
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

jieba.setLogLevel(logging.WARNING)  # it logs every dictionary load at INFO

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
_STOP_WORDS = frozenset(ENGLISH_STOP_WORDS - _CONTENT_WORDS_IN_STOP_LIST)
_WORD_TAGS: dict[str, str] | None = None


def _jieba_word_tags() -> dict[str, str]:
    """jieba's dictionary part-of-speech tag of every word it knows (loaded once per process)."""
    global _WORD_TAGS
    if _WORD_TAGS is None:
        import jieba.posseg  # here: importing it loads its models (~1.7 s), and only Chinese needs them

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
    if word.split("'")[0] in _STOP_WORDS or word.endswith("n't"):
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
