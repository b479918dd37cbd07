"""Finding rare-term occurrences in text, the tokens that cover them, and which ones to evaluate.

Occurrences are found in the documents' text, not in token ids. Byte-level BPE
on Chinese merges across word boundaries (there are no spaces), so in running
text a term's characters share tokens with their neighbours, and the term's own
token sequence, tokenized alone, may never occur in the token stream at all.
Text does not have that problem:

    >>> find_in_text("acute MI. Subacute MI and acute MIs; Acute mi", "acute MI")
    [(0, 8), (37, 45)]
    >>> find_in_text("董事会决定发行可交换保理。", "可交换保理")
    [(7, 12)]

Case does not matter: text and term are compared case folded (`str.casefold`,
so "PKI", "pki" and "Pki" are one term; Han and kana have no case, so Chinese
and Japanese match exactly), and each match is mapped back to the characters of
the original text, whose slice is the occurrence's `surface`, the term as
written there. A term that begins (ends) with a letter or digit of a
space-separated script matches only where the text has no such character right
before (after) it, so "acute MI" is not found inside "subacute MI" or "acute
MIs"; a Latin acronym between Han characters still matches ("使用PKI证书").
Han characters need no boundary by themselves, but a term of a Chinese corpus
(`Term.han_words`, set by `rare_terms` in terms.jsonl) matches only where it
starts and ends on a boundary of jieba's dictionary words in the text
(`word_boundaries`; the glossary's terms are words of that dictionary, so they
stay whole): it is never found inside a longer word, so 态 is not found in 状态,
only where 态 stands as a word of its own:

    >>> find_in_text("状态 的态", "态"), find_in_text("状态 的态", "态", han_words=True)
    ([(1, 2), (4, 5)], [(4, 5)])

Each match is then mapped to the document's tokens through the tokenizer's
character offsets (`locate`): the tokens that *cover* the term are those whose
characters overlap it. The first of them may begin before the term: in English
" infarction" carries its leading space; with byte-level BPE that merges Han
characters, "发行可" may begin two characters early. The evaluation's prompt ends
right before that first covering token (never inside a token, never inside a
character's bytes), and the model is asked to write `lead + surface`, where
`lead` is the document's text from that token's first character up to the term
(" " for English, "" when the term starts on a token boundary) and `surface` the
term as written at that occurrence ("PKI" where the text says "PKI", for the
term "pki").

When there are more occurrences than `eval.max_terms`, they are chosen round
robin over terms (one occurrence of every term, then a second of every term, ...),
so the cap never crowds out the rarest terms; each term's occurrences are taken in
a fixed pseudo-random order (a hash of document and position), so a capped sample
holds first and repeated mentions about as the text does (in text order, a term's
first pick would always be a first mention), and the choice is deterministic and
the same for every tokenizer. `eval.term_sample: occurrences` draws the cap from all
occurrences alike instead (`select_occurrences`), so a term counts as often as the text holds it:
the sample's repeat share is then about the text's (`term_repeat_share` against `term_repeat_share_text`).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import hashlib
import re
import sys
from collections.abc import Iterable

import numpy as np

from rarelm.artifacts.terms import Term
from rarelm.errors import RarelmError


@dataclasses.dataclass(frozen=True)
class Occurrence:
    term: int  # index into the terms list
    doc: int  # document index within the split
    char_start: int  # the term's first character in the document's text
    start: int  # split position of the first token that covers the term (the prompt ends before it)
    end: int  # split position after the last token that covers the term
    lead: str  # the document's text from `start`'s first character up to the term (" " in English)
    mention: str  # "first": no earlier occurrence of this term in its document; else "repeat"
    surface: str = ""  # the term as written here (find_occurrences sets it; "" = as the term's text)


# ---------------------------------------------------------------- search in text


def _is_cjk(ch: str) -> bool:
    o = ord(ch)
    return (0x4E00 <= o <= 0x9FFF or 0x3400 <= o <= 0x4DBF or 0x20000 <= o <= 0x2FA1F
            or 0xF900 <= o <= 0xFAFF or 0x3040 <= o <= 0x30FF)


def _word_char(ch: str) -> bool:
    """A letter or digit of a script that separates words by spaces."""
    return ch.isalnum() and not _is_cjk(ch)


_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f]")


def has_han(text: str) -> bool:
    """Whether `text` holds a Han character: such a term matches on jieba's word boundaries."""
    return _HAN.search(text) is not None


@functools.lru_cache(maxsize=2)
def _jieba_with(glossary: tuple[str, ...]):
    """A private jieba tokenizer whose dictionary holds the glossary terms as words."""
    from rarelm.rare_terms.segmentation import Segmenter  # jieba loads ~1 s: only for Han terms

    return Segmenter("zh", glossary)._jieba


@functools.lru_cache(maxsize=4)
def word_boundaries(text: str, glossary: tuple[str, ...] = ()) -> np.ndarray:
    """bool [len(text) + 1]: True where a jieba word of `text` starts or ends (the text is
    segmented lower-cased, as `Segmenter` segments it; glossary terms are single words).

    Dictionary words only (HMM off): jieba's HMM only joins runs of single characters that
    the dictionary does not know, so these boundaries include those of the segmentation that
    extracted the terms (HMM on), and every extracted n-gram lines up with them; a match is
    refused only where it cuts a word that jieba's dictionary or the glossary knows.
    Cached: evaluate searches one text for many terms.

    >>> word_boundaries("状态 态").astype(int).tolist()   # 状态 | " " | 态
    [1, 0, 1, 1, 1]
    """
    lower = text.lower()
    segmented = lower if len(lower) == len(text) else text
    edges = np.zeros(len(text) + 1, dtype=bool)
    edges[[0, len(text)]] = True
    for _, start, end in _jieba_with(glossary).tokenize(segmented, HMM=False):
        edges[start] = edges[end] = True
    edges.flags.writeable = False
    return edges


_EXPANDING: re.Pattern | None = None


def _expanding_characters() -> re.Pattern:
    """A character class of the characters whose case folding is longer than they are ("ß" -> "ss")."""
    global _EXPANDING
    if _EXPANDING is None:
        chars = [chr(c) for c in range(sys.maxunicode + 1) if len(chr(c).casefold()) > 1]
        _EXPANDING = re.compile("[" + "".join(map(re.escape, chars)) + "]")
    return _EXPANDING


class FoldedText:
    """A text case folded once, then searched for many terms (`find`).

    Folding keeps the length of almost every text; where a character folds to more
    ("ß" -> "ss"), `original` maps a folded position back, in O(log n) and with memory
    for those characters only:

    >>> t = FoldedText("Straße!")   # folded "strasse!": both s of "ß" come from character 4
    >>> [t.original(k) for k in (3, 4, 5, 6, 7)]
    [(3, True), (4, True), (4, False), (5, True), (6, True)]
    """

    def __init__(self, text: str):
        self.text, self.folded = text, text.casefold()
        self._starts: list[int] = []  # where each longer folding starts in the folded text
        self._ends: list[int] = []  # ... and ends
        self._origins: list[int] = []  # its character in the text
        if len(self.folded) != len(text):
            extra = 0
            for m in _expanding_characters().finditer(text):
                self._starts.append(m.start() + extra)
                extra += len(m[0].casefold()) - 1
                self._ends.append(m.start() + extra + 1)
                self._origins.append(m.start())

    def original(self, k: int) -> tuple[int, bool]:
        """The text character that folded character k comes from, and whether k is the first
        character of its folding."""
        j = bisect.bisect_right(self._starts, k) - 1
        if j < 0:
            return k, True
        if k < self._ends[j]:
            return self._origins[j], k == self._starts[j]
        return self._origins[j] + 1 + k - self._ends[j], True

    def _span(self, i: int, j: int) -> tuple[int, int] | None:
        """Folded characters [i, j) as text characters, None if they start or end inside one's folding."""
        start, whole_start = self.original(i)
        end, whole_end = self.original(j) if j < len(self.folded) else (len(self.text), True)
        return (start, end) if whole_start and whole_end else None

    def find(self, term: str, han_words: bool = False, glossary: tuple[str, ...] = (),
             words: bool = True) -> list[tuple[int, int]]:
        """(start, end) in the original text of each match of `term`, overlapping ones included;
        with `han_words`, a term with a Han character only on jieba's word boundaries
        (`word_boundaries` with `glossary`). words=False: every match of the string, no
        boundary checked (to count the matches inside longer words: rare_terms/quality.py)."""
        key = term.casefold()
        if not key:
            return []
        check_start, check_end = words and _word_char(term[0]), words and _word_char(term[-1])
        edges = word_boundaries(self.text, glossary) if words and han_words and has_han(term) else None
        text, found, i = self.text, [], self.folded.find(key)
        while i >= 0:
            span = self._span(i, i + len(key))
            if span is not None:
                start, end = span
                if not (check_start and start > 0 and _word_char(text[start - 1])) and \
                        not (check_end and end < len(text) and _word_char(text[end])) and \
                        (edges is None or (edges[start] and edges[end])):
                    found.append(span)
            i = self.folded.find(key, i + 1)
        return found


def find_in_text(text: str, term: str, han_words: bool = False,
                 glossary: tuple[str, ...] = ()) -> list[tuple[int, int]]:
    """(start, end) of each occurrence of `term` in `text`, whatever its case, word-boundary
    aware (with `han_words`, jieba's words for a term with Han characters, `glossary` terms
    kept whole; pass a Term's `han_words`, as `find_occurrences` does).

    >>> find_in_text("PKI, pki and Pki; not PKIs nor myPKI", "pki")
    [(0, 3), (5, 8), (13, 16)]
    >>> find_in_text("Die Straße, STRASSE", "strasse")   # "ß" folds to "ss": the match covers it whole
    [(4, 10), (12, 19)]
    """
    return FoldedText(text).find(term, han_words, glossary)


def glossary_of(terms: Iterable[Term]) -> tuple[str, ...]:
    """The glossary terms among `terms` (source "glossary"), as jieba's extra words."""
    return tuple(t.text for t in terms if t.source == "glossary")


def locate(token_offsets: list[tuple[int, int]], char_start: int, char_end: int) -> tuple[int, int]:
    """(first, stop): the tokens covering characters [char_start, char_end) of their document.

    `first` is moved back to a character boundary, so a prompt that ends before it
    never splits one character's bytes (byte-level BPE gives each byte-fragment
    token the offsets of the whole character):

    >>> locate([(0, 3), (3, 11), (11, 14), (14, 22), (22, 23)], 12, 22)   # " my|ocardial| in|farction|."
    (2, 4)
    >>> locate([(0, 1), (0, 2), (1, 3), (3, 4)], 1, 3)   # byte fragments sharing characters 0 and 1
    (0, 3)
    """
    starts = np.fromiter((s for s, _ in token_offsets), np.int64, len(token_offsets))
    ends = np.fromiter((e for _, e in token_offsets), np.int64, len(token_offsets))
    first = int(np.searchsorted(ends, char_start, side="right"))  # first token ending after char_start
    stop = int(np.searchsorted(starts, char_end, side="left"))  # tokens starting before char_end
    while first > 0 and starts[first] < ends[first - 1]:
        first -= 1
    return first, max(stop, first + 1)


def find_occurrences(tokenizer, documents: list[str], tokens: np.ndarray, offsets: np.ndarray,
                     terms: list[Term], batch_size: int = 1000) -> list[list[Occurrence]]:
    """Every occurrence of every term in a split's documents, per term, in text order, whatever
    its case (`FoldedText`); each keeps its `surface`, the term as written there. A term
    with `han_words` matches on jieba's word boundaries, the glossary's terms (source
    "glossary") kept whole.

    `tokenizer` is the pipeline's `tokenizers.Tokenizer`; `tokens` / `offsets` the
    split's token array and document boundaries (document d is
    tokens[offsets[d]:offsets[d+1]], its last token the end-of-text id). Only
    documents holding a term are re-encoded (for their character offsets); if the
    tokenizer does not reproduce the stored tokens, that is a one-line RarelmError.
    """
    if len(documents) != len(offsets) - 1:
        raise RarelmError(f"the prepared split has {len(documents)} documents but the tokenized one "
                          f"{len(offsets) - 1}; re-run the tokenize stage")
    joined = "\n".join(documents)  # one search per term over the whole split
    doc_starts = np.cumsum([0] + [len(d) + 1 for d in documents[:-1]])
    folded = FoldedText(joined)
    glossary = glossary_of(terms)
    spans: dict[int, list[tuple[int, int, int]]] = {}  # doc -> (char_start, term, char_end)
    for t, term in enumerate(terms):
        if "\n" in term.text:
            continue
        for i, j in folded.find(term.text, term.han_words, glossary):
            d = int(np.searchsorted(doc_starts, i, side="right")) - 1
            spans.setdefault(d, []).append((i - int(doc_starts[d]), t, j - int(doc_starts[d])))
    docs = sorted(spans)
    out: list[list[Occurrence]] = [[] for _ in terms]
    for b in range(0, len(docs), batch_size):
        batch = docs[b:b + batch_size]
        encodings = tokenizer.encode_batch([documents[d] for d in batch], add_special_tokens=False)
        for d, enc in zip(batch, encodings, strict=True):
            lo, hi = int(offsets[d]), int(offsets[d + 1])
            if len(enc.ids) != hi - lo - 1 or not np.array_equal(np.asarray(enc.ids), tokens[lo:hi - 1]):
                raise RarelmError(f"the tokenizer does not reproduce document {d} of the tokenized split; "
                                  "re-run the tokenize stage")
            seen: set[int] = set()
            for char_start, t, char_end in sorted(spans[d]):
                first, stop = locate(enc.offsets, char_start, char_end)
                lead = documents[d][enc.offsets[first][0]:char_start]
                out[t].append(Occurrence(t, d, char_start, lo + first, lo + stop, lead,
                                         "repeat" if t in seen else "first",
                                         documents[d][char_start:char_end]))
                seen.add(t)
    return out


def select_round_robin(per_term: list[list[Occurrence]], cap: int) -> list[Occurrence]:
    """At most `cap` occurrences: one of every term, then a second of every term, and so on,
    each term's in the fixed pseudo-random order of `_sample_order`; returned in the order
    (the occurrence's place in its term's text order, term), so with no more than `cap`
    occurrences this is every occurrence in the order it always had.

    >>> occ = [[Occurrence(0, 0, p, p, p + 1, "", "first") for p in (3, 8, 9)],
    ...        [Occurrence(1, 0, 5, 5, 6, "", "first")]]
    >>> [(o.term, o.start) for o in select_round_robin(occ, 3)]
    [(0, 3), (1, 5), (0, 9)]
    """
    drawn = [sorted(range(len(occ)), key=lambda i: _sample_order(occ[i])) for occ in per_term]
    ranked = sorted((pick, t, place) for t, order in enumerate(drawn) for pick, place in enumerate(order))
    return [per_term[t][place] for place, t in sorted((place, t) for _, t, place in ranked[:cap])]


def select_occurrences(per_term: list[list[Occurrence]], cap: int) -> list[Occurrence]:
    """At most `cap` occurrences drawn from all of them alike, each term weighted by how often the
    split holds it (`eval.term_sample: occurrences`; round robin gives every term its turn instead):
    the `cap` first in the fixed pseudo-random order of `_sample_order`, returned in the order
    `select_round_robin` uses, so with no more than `cap` occurrences the two agree.

    >>> occ = [[Occurrence(0, 0, p, p, p + 1, "", "first") for p in (3, 8, 9)],
    ...        [Occurrence(1, 0, 5, 5, 6, "", "first")]]
    >>> select_occurrences(occ, 4) == select_round_robin(occ, 4)
    True
    """
    ranked = sorted((_sample_order(o), place, t)
                    for t, occ in enumerate(per_term) for place, o in enumerate(occ))
    return [per_term[t][place] for place, t in sorted((place, t) for _, place, t in ranked[:cap])]


def select(per_term: list[list[Occurrence]], cap: int, sample: str = "terms") -> list[Occurrence]:
    """The scored occurrences: round robin over terms (`terms`) or drawn over occurrences."""
    return (select_occurrences if sample == "occurrences" else select_round_robin)(per_term, cap)


def _sample_order(o: Occurrence) -> tuple[bytes, int, int]:
    """A fixed pseudo-random rank of an occurrence within its term: a BLAKE2b hash of
    "doc:char_start" (positions in characters, so every tokenizer and every run draws the same
    sample; CRC-32, linear, ranks such near-identical strings far from at random)."""
    return hashlib.blake2b(f"{o.doc}:{o.char_start}".encode(), digest_size=8).digest(), o.doc, o.char_start


# ---------------------------------------------------------------- bands and prompts


def band_index(count: int) -> int:
    """0 for count 0, then k for counts in [2^(k-1), 2^k): bands double in width."""
    return int(count).bit_length() if count > 0 else 0


def band_label(count: int) -> str:
    """A term's train-count band as text.

    >>> [band_label(c) for c in (0, 1, 3, 4, 15, 1000)]
    ['0', '1', '2-3', '4-7', '8-15', '512-1023']
    """
    k = band_index(count)
    if k <= 1:
        return str(k)
    return f"{1 << (k - 1)}-{(1 << k) - 1}"


def frequency_band(count: int) -> str:
    """The band as a plot label that sorts in band order.

    >>> [frequency_band(c) for c in (0, 1, 3, 4, 1000)]
    ['band 00: 0', 'band 01: 1', 'band 02: 2-3', 'band 03: 4-7', 'band 10: 512-1023']
    """
    return f"band {band_index(count):02d}: {band_label(count)}"


def prompt_before(tokens: np.ndarray, doc_start: int, position: int, context_tokens: int,
                  eot_id: int) -> list[int]:
    """The up to `context_tokens` tokens before `position`, within its document.

    The document's text is preceded by the end-of-text token (as after the
    previous document), so a term at the very start still has a one-token prompt:

    >>> prompt_before(np.array([0, 4, 5, 6, 0, 7, 8]), doc_start=5, position=6, context_tokens=3, eot_id=0)
    [0, 7]
    """
    lo = max(doc_start, position - context_tokens)
    prompt = [int(t) for t in tokens[lo:position]]
    if position - doc_start < context_tokens:
        prompt.insert(0, eot_id)
    return prompt


def document_starts(offsets: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """For each position, the start of the document holding it (offsets: document boundaries).

    >>> document_starts(np.array([0, 3, 7]), np.array([0, 2, 3, 6])).tolist()
    [0, 0, 3, 3]
    """
    index = np.searchsorted(offsets, positions, side="right") - 1
    return offsets[index]


def term_token_mask(per_term: list[list[Occurrence]], n_tokens: int) -> np.ndarray:
    """Boolean per split position: the token covers (part of) a term occurrence.

    >>> occ = [[Occurrence(0, 0, 0, 1, 3, "", "first")], [Occurrence(1, 0, 9, 2, 4, " ", "first")]]
    >>> term_token_mask(occ, 6).astype(int).tolist()
    [0, 1, 1, 1, 0, 0]
    """
    delta = np.zeros(n_tokens + 1, dtype=np.int64)
    for occurrences in per_term:
        for o in occurrences:
            delta[o.start] += 1
            delta[o.end] -= 1
    return np.cumsum(delta[:-1]) > 0
