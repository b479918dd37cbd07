"""Finding rare-term occurrences in a token array, and choosing which ones to evaluate.

A term (one line of data/rare/terms.jsonl) comes with the token-id sequences it
takes under the pipeline's tokenizer (with and without a leading space). Every
place a sequence occurs in the split is an occurrence:

    >>> tokens = np.array([7, 1, 2, 3, 9, 1, 2, 0, 1, 2, 3])
    >>> [p.tolist() for p in find_sequences(tokens, [[1, 2, 3], [9]])]
    [[1, 8], [4]]

The search sorts each chunk of the array once (positions grouped by token id),
then checks only the positions holding a sequence's first token, so it costs
O(n log n) for the whole split plus the candidates, and memory is bounded by the
chunk, not the split.

When there are more occurrences than `eval.max_terms`, they are chosen round
robin over terms (every term's first occurrence, then every term's second, ...),
so the cap never crowds out the rarest terms, and the choice is deterministic.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from rarelm.errors import RarelmError

CHUNK_TOKENS = 1 << 22


@dataclasses.dataclass(frozen=True)
class Term:
    text: str
    count: int  # occurrences in the train split (how rare the term is)
    sequences: tuple[tuple[int, ...], ...]  # distinct token-id sequences, each non-empty


@dataclasses.dataclass(frozen=True)
class Occurrence:
    term: int  # index into the terms list
    position: int  # index of the term's first token in the split
    sequence: tuple[int, ...]  # which of the term's sequences occurs there


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
                sequences = tuple(dict.fromkeys(tuple(int(t) for t in s) for s in row["token_ids"] if s))
                terms.append(Term(str(row["term"]), int(row["count"]), sequences))
            except (ValueError, KeyError, TypeError) as exc:
                raise RarelmError(
                    f"{path}:{line_no}: not a term record ({type(exc).__name__}: {exc})") from None
    return terms


def find_sequences(tokens: np.ndarray, sequences: list[list[int]],
                   chunk_tokens: int = CHUNK_TOKENS) -> list[np.ndarray]:
    """Sorted start positions of every sequence in `tokens` (overlapping matches included)."""
    found: list[list[np.ndarray]] = [[] for _ in sequences]
    if not sequences or len(tokens) == 0:
        return [np.zeros(0, dtype=np.int64) for _ in sequences]
    by_first: dict[int, list[int]] = {}
    for i, seq in enumerate(sequences):
        by_first.setdefault(int(seq[0]), []).append(i)
    longest = max(len(s) for s in sequences)
    for start in range(0, len(tokens), chunk_tokens):
        stop = min(start + chunk_tokens, len(tokens))
        # the window reaches past the chunk so a match may start near its end
        window = np.asarray(tokens[start:min(stop + longest - 1, len(tokens))], dtype=np.int64)
        head = window[:stop - start]
        order = np.argsort(head, kind="stable")  # stable: positions ascend within one token id
        sorted_ids = head[order]
        for first, indices in by_first.items():
            lo, hi = np.searchsorted(sorted_ids, first, "left"), np.searchsorted(sorted_ids, first, "right")
            candidates = order[lo:hi]
            for i in indices:
                seq = sequences[i]
                hits = candidates[candidates + len(seq) <= len(window)]
                for j in range(1, len(seq)):
                    hits = hits[window[hits + j] == seq[j]]
                found[i].append(hits + start)
    return [np.concatenate(parts).astype(np.int64) for parts in found]


def find_occurrences(tokens: np.ndarray, terms: list[Term], joins_word: np.ndarray | None = None,
                     chunk_tokens: int = CHUNK_TOKENS) -> list[list[Occurrence]]:
    """Every occurrence of every term, per term, by position.

    `joins_word[t]` (optional, per token id) is 1 where token t ends in a letter
    or digit and 2 where it starts with one (3: both). A match whose first token
    starts with a letter right after a token that ends in one sits inside a word
    (the space-less variant of "art" in "st|art") and is dropped.
    """
    flat = [list(seq) for term in terms for seq in term.sequences]
    owners = [i for i, term in enumerate(terms) for _ in term.sequences]
    positions = find_sequences(tokens, flat, chunk_tokens)
    out: list[list[Occurrence]] = [[] for _ in terms]
    for owner, seq, pos in zip(owners, flat, positions, strict=True):
        if joins_word is not None and len(pos) and joins_word[seq[0]] & 2:
            prev = np.asarray(tokens)[np.maximum(pos - 1, 0)].astype(np.int64)
            pos = pos[(pos == 0) | ((joins_word[prev] & 1) == 0)]
        out[owner].extend(Occurrence(owner, int(p), tuple(seq)) for p in pos)
    for occurrences in out:
        occurrences.sort(key=lambda o: (o.position, o.sequence))
    return out


def select_round_robin(per_term: list[list[Occurrence]], cap: int) -> list[Occurrence]:
    """At most `cap` occurrences: every term's first, then every term's second, and so on.

    >>> occ = [[Occurrence(0, p, (1,)) for p in (3, 8, 9)], [Occurrence(1, 5, (2,))]]
    >>> [(o.term, o.position) for o in select_round_robin(occ, 3)]
    [(0, 3), (1, 5), (0, 8)]
    """
    ranked = sorted(((rank, o.term, o) for occurrences in per_term
                     for rank, o in enumerate(occurrences)), key=lambda x: (x[0], x[1]))
    return [o for _, _, o in ranked[:cap]]


def word_joins(tokenizer, vocab_size: int) -> np.ndarray:
    """Per token id: bit 1 if it ends with an ASCII letter or digit, bit 2 if it starts with one.

    Read from the raw token strings, where a word-initial token carries its
    space marker ("Ġstart" in byte-level BPE, "▁start" in SentencePiece): decoding
    a single SentencePiece token would drop that space. Non-ASCII letters (CJK)
    never join, since those scripts do not separate words by spaces.
    """
    texts = [t or "" for t in tokenizer.convert_ids_to_tokens(list(range(vocab_size)))]
    out = np.zeros(vocab_size, dtype=np.int8)
    for i, text in enumerate(texts):
        if text and text[-1].isascii() and text[-1].isalnum():
            out[i] |= 1
        if text and text[0].isascii() and text[0].isalnum():
            out[i] |= 2
    return out


def frequency_band(count: int) -> str:
    """A term's train-count band, doubling in width; labels sort in band order.

    >>> [frequency_band(c) for c in (0, 1, 3, 4, 1000)]
    ['band 00: 0', 'band 01: 1', 'band 02: 2-3', 'band 03: 4-7', 'band 10: 512-1023']
    """
    if count <= 0:
        return "band 00: 0"
    k = int(count).bit_length()  # 1 -> 1, 2..3 -> 2, 4..7 -> 3, ...
    lo, hi = 1 << (k - 1), (1 << k) - 1
    return f"band {k:02d}: {lo}" if lo == hi else f"band {k:02d}: {lo}-{hi}"


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
