"""rare_terms.segmentation: words, phrases and what may be a term (one test per rule)."""

from __future__ import annotations

from rarelm.rare_terms.segmentation import Segmenter, join_words
from tests.helpers import candidates


def test_english_phrases_stop_at_punctuation_and_digits():
    seg = Segmenter("en")
    assert list(seg.phrases("Assessment: Bilateral nephrosclerosis, seen 3 times; year-old")) == [
        ["assessment"], ["bilateral", "nephrosclerosis"], ["seen"], ["times"], ["year-old"]]


def test_chinese_glossary_terms_stay_whole():
    text = "董事会决定发行质押式掉期产品。"
    plain = [w for p in Segmenter("zh").phrases(text) for w in p]
    assert "质押式掉期产品" not in plain
    assert "质押式掉期产品" in [w for p in Segmenter("zh", ["质押式掉期产品"]).phrases(text) for w in p]
    assert join_words(["债券", "ABS", "CLO", "产品"], "") == "债券ABS CLO产品"


def test_rule1_no_stop_word_at_an_edge_english():
    found = candidates("en", "Return a copy of the list to back up a valid system call.")
    assert {"copy", "list", "valid system call"} <= set(found)  # "system" is a content word
    assert not [t for t in found if t.split()[0] in {"a", "the", "to", "of", "up"}
                or t.split()[-1] in {"a", "the", "to", "of", "up"}]
    assert "fetch a" not in candidates("en", "fetch a branch")
    # "of" links words inside a term; "the", "that" or "is" split the phrase
    assert "point of care" in candidates("en", "the point of care")
    assert "copy of the list" not in found
    assert candidates("en", "lock that is held") == ["lock", "held"]


def test_rule1_no_function_word_at_an_edge_chinese():
    found = candidates("zh", "试着对文本进行补全。光标移动到行首。本次质押式回购募集资金。")
    assert not [t for t in found if t[0] in "对将从的了" or t[-1] in "对到的了"]
    assert "光标移动到" not in found and "重定向到" not in candidates("zh", "将输出重定向到文件")
    # particles and conjunctions never sit inside a term: no "文本的补全"
    assert not [t for t in candidates("zh", "列出文本的补全和文件") if "的" in t or "和" in t]


def test_rule2_no_punctuation_hyphen_or_quote_at_an_edge():
    assert candidates("en", "use --color or -- 'quoted' ibus- here") == [
        "use", "color", "quoted", "ibus"]
    found = candidates("zh", "由 bash-doc 包提供。选项 --color 和 ibus- 输入法，'alias")
    assert "bash-doc" in found
    assert not [t for t in found if not (t[0].isalpha() and t[-1].isalpha())]


def test_rule3_no_latin_fragments():
    # one lower-case letter, two lower-case letters at an edge, pieces of tokens with digits
    assert candidates("en", "p and co and dx value, the st_mode field, IPv6 hosts") == [
        "value", "field", "hosts"]
    # capitals are acronyms or named letters, at the edge of a term with a longer word only
    found = candidates("en", "CT scan and vitamin D; the graph D---G---H")
    assert {"ct scan", "vitamin d"} <= set(found)
    assert not {"ct", "d", "g", "d g", "g h"} & set(found)
    found = candidates("zh", "使用B超检查，保存在 f 中的 d目录")
    assert {"b超", "b超检查", "目录"} <= set(found) and not {"b", "f", "d", "d目录"} & set(found)


def test_rule4_latin_and_chinese_are_not_glued_across_a_space():
    found = candidates("zh", "将 command 的标准输出重定向到文件。由 bash-doc 包提供的")
    assert "将command" not in found and "command" in found
    assert not [t for t in found if "doc包" in t or "command标准" in t]
    assert "diff文件" in candidates("zh", "生成diff文件")  # glued in the text: kept
    assert "gnu general public license" in candidates("zh", "遵从 GNU General Public License 条款")
    assert "string cfg" not in candidates("en", "the string 'cfg://x' names it")
