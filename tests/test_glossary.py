"""rare_terms.glossary: reading glossaries and scoring an extraction against a reference."""

from __future__ import annotations

import pytest

from rarelm.errors import RarelmError
from rarelm.rare_terms.glossary import extraction_scores, read_glossary, read_reference


def test_extraction_scores_known_case():
    found = ["renal colic", "gout", "patient", "Acute Gastritis"]
    reference = ["acute gastritis", "renal  colic", "gout", "nephritis", "asthma", "eczema"]
    s = extraction_scores(found, reference)
    assert (s["true_positives"], s["precision"], s["recall"]) == (3, 0.75, 0.5)
    assert s["f1"] == pytest.approx(0.6)
    assert extraction_scores([], reference)["f1"] == 0.0


def test_read_glossaries(tmp_path):
    user = tmp_path / "g.txt"
    user.write_text("\ufeffrenal colic\n\n  gout  \nrenal colic\n", encoding="utf-8")
    assert read_glossary(user) == ["renal colic", "gout"]
    ref = tmp_path / "ref.tsv"
    ref.write_text("term\tdocuments\nrenal colic\t3\ngout\t2\n", encoding="utf-8")
    assert read_reference(ref) == ["renal colic", "gout"]
    assert read_glossary(ref) == ["renal colic", "gout"]  # a TSV glossary: its `term` column
    (tmp_path / "empty.txt").write_text("\n \n", encoding="utf-8")
    with pytest.raises(RarelmError, match="holds no term"):
        read_glossary(tmp_path / "empty.txt")
    (tmp_path / "gbk.txt").write_bytes("质押式回购\n".encode("gbk"))
    with pytest.raises(RarelmError, match="not valid UTF-8"):
        read_glossary(tmp_path / "gbk.txt")
