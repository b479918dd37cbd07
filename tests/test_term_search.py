"""rare_terms.term_search: Chinese terms on jieba's word boundaries (term_search's other behaviour,
occurrences mapped to tokens and the round-robin cap, is tested in test_evaluate.py)."""

from __future__ import annotations

import numpy as np

from rarelm.rare_terms import term_search
from rarelm.rare_terms.term_search import find_in_text, word_boundaries


def test_a_chinese_term_is_never_found_inside_a_longer_word():
    text = "状态 态 的态。套接字"
    # 态 inside 状态 is no occurrence; where jieba reads 态 as a word of its own, it is
    assert find_in_text(text, "态", han_words=True) == [(3, 4), (6, 7)]
    assert find_in_text(text, "状态", han_words=True) == [(0, 2)]
    # without han_words (a term of a corpus that is not Chinese) Han characters match anywhere
    assert find_in_text(text, "态", han_words=False) == [(1, 2), (3, 4), (6, 7)]
    # 套 + 接字: jieba's dictionary has no 套接字; a glossary makes it one word, and then
    # 接字 is inside it
    assert find_in_text(text, "套接字", han_words=True) == [(8, 11)]
    assert find_in_text(text, "接字", han_words=True, glossary=("套接字",)) == []
    assert find_in_text(text, "套接字", han_words=True, glossary=("套接字",)) == [(8, 11)]


def test_english_terms_and_latin_inside_chinese_are_unchanged():
    for han_words in (False, True):
        assert find_in_text("art start art. arts", "art", han_words=han_words) == [(0, 3), (10, 13)]
        assert find_in_text("API网关 myAPI网关 通过API网关调用", "API网关",
                            han_words=han_words) == [(0, 5), (16, 21)]
        assert find_in_text("使用PKI证书", "pki", han_words=han_words) == [(2, 5)]


def test_word_boundaries_are_jieba_dictionary_words():
    # 一二|一二三|一二: the 一二 at 2 sits inside 一二三
    assert word_boundaries("一二一二三一二").astype(int).tolist() == [1, 0, 1, 0, 0, 1, 0, 1]
    assert term_search.FoldedText("一二一二三一二").find("一二", han_words=True) == [(0, 2), (5, 7)]
    # every match of the string, boundaries ignored (the quality metric's denominator)
    assert term_search.FoldedText("一二一二三一二").find("一二", words=False) == [(0, 2), (2, 4), (5, 7)]


def test_occurrences_of_a_chinese_corpus_term_follow_its_han_words_flag():
    from rarelm.artifacts.terms import Term
    from rarelm.tokenize.tokenization import EOT, train_bpe

    docs = ["进程状态 态", "态"]
    tok = train_bpe(iter(docs * 20), vocab_size=300, min_frequency=2)
    eot = tok.token_to_id(EOT)
    ids = [tok.encode(d, add_special_tokens=False).ids + [eot] for d in docs]
    tokens = np.array(ids[0] + ids[1])
    offsets = np.array([0, len(ids[0]), len(ids[0]) + len(ids[1])])
    (found,) = term_search.find_occurrences(tok, docs, tokens, offsets, [Term("态", 1, han_words=True)])
    assert [(o.doc, o.char_start, o.mention) for o in found] == [(0, 5, "first"), (1, 0, "first")]
    (found,) = term_search.find_occurrences(tok, docs, tokens, offsets, [Term("态", 1)])
    assert [(o.doc, o.char_start) for o in found] == [(0, 3), (0, 5), (1, 0)]
