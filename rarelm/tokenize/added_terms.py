"""Terms as tokens (`tokenizer.add_terms`): the domain's terms join the tokenizer as whole tokens.

Vocabulary adaptation (Sachidananda, Kessler & Lai 2021, "Efficient Domain Adaptation of Language
Models via Adaptive Tokenization"; Gee et al. 2022, "Fast Vocabulary Transfer for Language Model
Compression"): a term the pretrained tokenizer splits into sub-tokens s_1..s_n becomes one new
token t, and its embedding starts as the mean of theirs (rarelm/train/added_embeddings.py):

    E[t] = (1/n) * sum_i E[s_i]        (input rows; output rows too where they are not tied)

This module builds the tokenizer side. The term list is the one `rare_terms` will write
(`domain_terms`: glossary first, then TF-IDF by score, the same library calls on the same `rare`
params): it is read from text alone, so it does not depend on the tokenizer it extends. Each term
is added in the form train writes it most often (terms.jsonl's `display`), as a Hugging Face
added token: matched on the raw text before pre-tokenization, so a term of several words
("acute MI") is one token too, and AutoTokenizer reproduces it from the saved folder.

- English (any corpus but "zh"): the token is " " + term, the form byte-level BPE gives a word
  mid-sentence (" acute MI"). A term at the very start of a document or after a newline keeps
  its sub-tokens. The leading space means the token never starts inside a word ("art" is never
  found in "start"); that it never ends inside one is checked on the corpus (`inside_words`):
  tokenizers' `single_word` flag cannot be used, it refuses a match whenever the text before it
  ends in a letter, i.e. every " art" after "the".
- Chinese: the token is the term itself; added tokens match any substring, jieba cannot run
  inside the tokenizer. A Han term may therefore match inside a longer word; the TF-IDF list
  already skips candidates that sit inside longer words in more than `rare.max_inside_share` of
  their matches (rarelm/rare_terms/quality.py), and a Latin letter or digit on either side of a
  match is refused here as in English.

A term whose token matches anywhere in the corpus (all splits) with a letter or digit of a
space-separated script right after it (or, for a form without the leading space, right before
it) is not added ("art" where the text also writes "artist"), and the check runs again on what
is left, since a longer token ("APIs") that was dropped may uncover a shorter one's match. A
term already one token is not added either. At most `tokenizer.add_terms_max` are added: the
first that many candidates in term-list order (those then dropped as inside words are not
replaced by later terms).

Worked example (tests/test_terms_as_tokens.py): the glossary "acute mi", "fever", "art" over a
hand-built BPE of 268 tokens that writes " acute mi" as [" ac", "ute", " mi"] (ids 258, 260, 262)
adds " fever" (268), " art" (269) and " acute mi" (270, recorded as {"term": "acute mi",
"token": " acute mi", "id": 270, "sub_ids": [258, 260, 262]}); "the acute mi was" then encodes
as [t, h, e, " acute mi", " ", w, a, s], while "start" keeps its "art" in plain sub-tokens.

data/tokenized/added_terms.json holds {"language", "base_vocab_size", "terms": [those records],
"dropped": {"inside_words": [...], "one_token": [...], "over_max": n}}.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from rarelm.errors import RarelmError
from rarelm.files import write_json

ADDED_TERMS = "added_terms.json"


def domain_terms(rare, prepared_dir: Path) -> tuple[list[str], list[str], str]:
    """(terms, glossary terms, language): the term list `rare_terms` writes to terms.jsonl, in its
    order, from the same functions and `rare` params (rarelm/rare_terms/stage.py `rare_terms`)."""
    # on use: jieba and scikit-learn load only when the param is on
    from rarelm.rare_terms.stage import term_list

    if not rare.tfidf and not rare.glossary:
        raise RarelmError("tokenizer.add_terms: rare.tfidf: false leaves no term without a "
                          "rare.glossary; set rare.glossary or rare.tfidf: true")
    terms = term_list(rare, prepared_dir)
    language, table = terms.language, terms.table
    return ([row["term"] for row in table],
            [row["term"] for row in table if row["source"] == "glossary"], language)


def display_forms(terms: list[str], documents: Iterable[str], han_words: bool,
                  glossary: tuple[str, ...] = ()) -> list[str]:
    """Each term as train writes it most often (terms.jsonl's `display`, by the search `evaluate`
    uses: whatever the case, on word boundaries); the term itself where train never has it.

    >>> display_forms(["pki", "x509"], ["PKI and pki, PKI"], False)
    ['PKI', 'x509']
    """
    from rarelm.rare_terms.term_index import display_form
    from rarelm.rare_terms.term_search import FoldedText

    forms: list[Counter[str]] = [Counter() for _ in terms]
    for document in documents:
        text = FoldedText(document)
        for form, term in zip(forms, terms, strict=True):
            form.update(document[s:e] for s, e in text.find(term, han_words, glossary))
    return [display_form(term, form) for term, form in zip(terms, forms, strict=True)]


def token_content(display: str, language: str) -> str:
    """The added token's text: " " + term outside Chinese (a word mid-sentence in byte-level BPE).

    >>> token_content("acute MI", "en"), token_content("心肌梗死", "zh")
    (' acute MI', '心肌梗死')
    """
    return display if language == "zh" else " " + display


def _word_char(ch: str) -> bool:
    from rarelm.rare_terms.term_search import _word_char as word_char  # the evaluate search's rule

    return word_char(ch)


def cuts_a_word(text: str, start: int, end: int, content: str) -> bool:
    """Whether the added token `content`, matched at text[start:end], ends inside a word (a Latin
    letter or digit on both sides of `end`) or, without a leading space, starts inside one.

    >>> cuts_a_word("the artist", 3, 7, " art"), cuts_a_word("the art.", 3, 7, " art")
    (True, False)
    >>> cuts_a_word("myPKI", 2, 5, "PKI"), cuts_a_word("使用PKI证书", 2, 5, "PKI")
    (True, False)
    """
    at_end = end < len(text) and _word_char(content[-1]) and _word_char(text[end])
    at_start = not content.startswith(" ") and start > 0 and _word_char(content[0]) \
        and _word_char(text[start - 1])
    return at_end or at_start


def extended(base, contents: list[str]):
    """A copy of the tokenizers.Tokenizer `base` with `contents` as added tokens (raw text, no
    normalizer, no whole-word flag: see the module docstring)."""
    from tokenizers import AddedToken, Tokenizer

    tokenizer = Tokenizer.from_str(base.to_str())
    tokenizer.add_tokens([AddedToken(c, normalized=False, single_word=False, lstrip=False,
                                     rstrip=False) for c in contents])
    return tokenizer


def inside_words(base, contents: list[str], corpus: Callable[[], Iterator[list[str]]]) -> set[str]:
    """The contents whose token, added with the others to `base`, matches inside a word somewhere
    in `corpus()` (batches of documents), dropped until none does (see the module docstring)."""
    kept, dropped = list(contents), set()
    while kept:
        tokenizer = extended(base, kept)
        content_of = {tokenizer.token_to_id(c): c for c in kept}
        bad = set()
        for batch in corpus():
            for text, enc in zip(batch, tokenizer.encode_batch(batch, add_special_tokens=False),
                                 strict=True):
                for token, (start, end) in zip(enc.ids, enc.offsets, strict=True):
                    content = content_of.get(token)
                    if content is not None and content not in bad and \
                            cuts_a_word(text, start, end, content):
                        bad.add(content)
        if not bad:
            break
        dropped |= bad
        kept = [c for c in kept if c not in bad]
    return dropped


def add_terms(tok_dir: Path, rare, max_terms: int, prepared_dir: Path, batch_size: int) -> dict:
    """Extend the Hugging Face tokenizer saved in tok_dir with the domain's terms (saved again
    there, so AutoTokenizer loads the extended one); returns added_terms.json's content."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer  # here: importing transformers takes ~6 s

    from rarelm.prepare.corpus import SPLITS, read_split

    terms, glossary, language = domain_terms(rare, prepared_dir)
    hf = AutoTokenizer.from_pretrained(tok_dir, local_files_only=True)
    base = hf.backend_tokenizer
    candidates, seen, one_token, examined = [], set(), [], 0
    # display forms chunk by chunk, until max_terms candidates: the search is terms x documents
    # (a glossary of 16,000 terms would cost 16x the cap's)
    while examined < len(terms) and len(candidates) < max_terms:
        chunk = terms[examined:examined + max_terms]
        displays = display_forms(chunk, read_split(prepared_dir, "train"), language == "zh",
                                 tuple(glossary))
        for term, display in zip(chunk, displays, strict=True):
            if len(candidates) == max_terms:
                break
            examined += 1
            content = token_content(display, language)
            if content in seen:
                continue
            seen.add(content)
            if len(base.encode(content, add_special_tokens=False).ids) <= 1 or \
                    base.token_to_id(content) is not None:
                one_token.append(term)
            else:
                candidates.append((term, content))
    over_max = len(terms) - examined  # never looked at: the cap was reached before them

    def corpus() -> Iterator[list[str]]:
        for split in SPLITS:
            documents = read_split(prepared_dir, split)
            while batch := list(itertools.islice(documents, batch_size)):
                yield batch

    bad = inside_words(base, [c for _, c in candidates], corpus)
    added = [(term, c) for term, c in candidates if c not in bad]
    sub_ids = {c: base.encode(c, add_special_tokens=False).ids for _, c in added}
    base_vocab = len(hf)
    hf.add_tokens([AddedToken(c, normalized=False, single_word=False, lstrip=False, rstrip=False)
                   for _, c in added])
    hf.save_pretrained(tok_dir)
    records = [{"term": term, "token": c, "id": hf.convert_tokens_to_ids(c), "sub_ids": sub_ids[c]}
               for term, c in added]
    if [r["id"] for r in records] != list(range(base_vocab, base_vocab + len(records))):
        raise RarelmError(f"tokenizer.add_terms: the tokenizer did not give the {len(records)} "
                          f"terms the ids after its {base_vocab} tokens")  # a term was a token
    return {"language": language, "base_vocab_size": base_vocab, "terms": records,
            "dropped": {"inside_words": [t for t, c in candidates if c in bad],
                        "one_token": one_token, "over_max": over_max}}


def write_added(out_dir: Path, added: dict) -> None:
    write_json(out_dir / ADDED_TERMS, added)
