import gzip
import hashlib

from rarelm.prepare import demo
from tests.conftest import REPO


def test_glossary_is_zipf_like_from_hundreds_down_to_two():
    for language in ("en", "zh"):
        docs, glossary = demo.generate(language)
        counts = [t.count for t in glossary]
        assert len(glossary) == 300 and len({t.text for t in glossary}) == 300
        assert counts == sorted(counts, reverse=True)
        assert counts[0] == 700 and counts[1] == 350 and counts[-1] == 2
        # each term has its own cue pair, so it is predictable from the text before it
        assert len({(t.cue_a, t.cue_b) for t in glossary}) == 300
        text = "\n".join(docs)
        rarest = glossary[-1]
        first = demo.SPECS[language]["first"].format(a=rarest.cue_a, b=rarest.cue_b, term=rarest.text)
        assert text.count(first) == rarest.count


def test_english_terms_are_multi_word_chinese_multi_character():
    _, en = demo.generate("en", n_terms=20, top_count=10)
    _, zh = demo.generate("zh", n_terms=20, top_count=10)
    assert all(len(t.text.split()) >= 2 for t in en)
    assert all(len(t.text) >= 4 and " " not in t.text for t in zh)


def test_committed_demo_files_rebuild_bit_for_bit(tmp_path):
    written = demo.write(tmp_path)
    for path in written:
        committed = REPO / "data" / "raw" / path.name
        assert hashlib.sha256(path.read_bytes()).hexdigest() == \
            hashlib.sha256(committed.read_bytes()).hexdigest(), path.name
    with gzip.open(tmp_path / "demo_en.txt.gz", "rt", encoding="utf-8") as f:
        assert sum(1 for _ in f) > 2000
