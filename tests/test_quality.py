"""rare_terms.quality: the term list's share of test matches inside longer words, terms per stratum."""

from __future__ import annotations

from rarelm.rare_terms.quality import fragment_filter, stratum, term_list_quality


def test_inside_longer_words_and_strata_by_hand_english():
    rows = [{"term": "art", "train_occurrences": 0}, {"term": "renal colic", "train_occurrences": 2},
            {"term": "MI", "display": "MI", "train_occurrences": 16}]
    docs = ["Start the art of renal colic; arts.", "acute MI, mi, MIs and Renal Colic"]
    q = term_list_quality(rows, docs, han_words=False)
    # art: 3 matches (stArt, art, arts), 1 on word boundaries; renal colic: 2 and 2;
    # mi: 3 matches (MI, mi, MIs), 2 on boundaries -> 8 matches, 5 occurrences, 3 inside
    assert (q["test_matches"], q["test_occurrences"], q["inside_longer_word"]) == (8, 5, 3)
    assert q["inside_longer_word_share"] == 0.375
    assert q["terms_by_train_count"] == {"0-1": 1, "2-15": 1, "16_up": 1}
    # art: 2 of 3 inside, more than not; mi: 1 of 3; renal colic: 0
    assert (q["terms_in_test"], q["terms_mostly_inside_longer_words"]) == (3, 1)
    # repeats: renal colic once in each document, mi twice in the second (MI, mi) -> 1 of 5
    assert q["test_repeat_share"] == 0.2


def test_inside_longer_words_chinese():
    rows = [{"term": "态", "train_occurrences": 1}, {"term": "状态", "train_occurrences": 30}]
    # 态: 2 matches (in 状态, alone), 1 a word; 状态: 1 match, a word -> 3 matches, 1 inside
    q = term_list_quality(rows, ["进程状态 态"], han_words=True)
    assert (q["test_matches"], q["test_occurrences"], q["inside_longer_word"]) == (3, 2, 1)
    assert q["inside_longer_word_share"] == round(1 / 3, 6)
    assert q["test_repeat_share"] == 0.0  # 态 and 状态 once each
    assert q["terms_by_train_count"] == {"0-1": 1, "2-15": 0, "16_up": 1}


def test_strata_edges():
    assert [stratum(c) for c in (0, 1, 2, 15, 16, 10**6)] == ["0-1", "0-1", "2-15", "2-15", "16_up", "16_up"]


def test_fragment_filter_by_hand():
    docs = ["括号 圆括号 中括号 括号", "状态 态"]
    # 括号: 4 matches, 2 inside (圆括号, 中括号 are jieba words): share 0.5
    assert fragment_filter(docs, True, 0.25)("括号") and not fragment_filter(docs, True, 0.5)("括号")
    assert not fragment_filter(docs, True, 0.25)("状态")  # 1 match, a word
    assert fragment_filter(docs, True, 0.25)("态")  # 2 matches, 1 inside 状态: 0.5
    assert not fragment_filter(docs, True, 0.25)("missing")  # no match: nothing to judge
