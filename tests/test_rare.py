"""rare_terms: the stage through its CLI (outputs, bad input), where terms occur in the train split,
terms whatever their case on real text. Its parts: test_buckets, test_segmentation, test_tfidf,
test_glossary."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys

import numpy as np
import pytest

from rarelm.artifacts.term_index import TermIndex
from rarelm.artifacts.tokenized import TokenizedData, load_tokenizer
from rarelm.errors import RarelmError
from rarelm.prepare.corpus import read_split
from rarelm.rare_terms.glossary import extraction_scores, read_reference
from rarelm.rare_terms.stage import rare_terms
from rarelm.rare_terms.term_index import build_term_index, display_form, surface_forms
from tests.conftest import BIN, REPO, assert_user_error, set_params, stage, staged_folder

# ------------------------------------------------------------------ the stage through its CLI


@pytest.fixture(scope="module")
def tokenized_en(tmp_path_factory, tiny_raw):
    """A folder with params.yaml and the tiny English corpus prepared and tokenized."""
    return staged_folder(tmp_path_factory.mktemp("rare_en"), tiny_raw, ["prepare", "tokenize"], **{
        "corpus.reference_glossary": str(tiny_raw / "demo_en.glossary.tsv"), "tokenizer.vocab_size": 512})


@pytest.fixture
def work(tokenized_en, tmp_path):
    root = tmp_path / "work"
    shutil.copytree(tokenized_en, root)
    return root


def test_a_long_run_logs_each_part_as_it_ends(work, monkeypatch, tmp_path):
    """Issue 57: rare_terms ran ~5 min on a real corpus without a line. Once it has run 10 s it logs
    each part (here from the start: quiet 0), in the order they run, each with the time so far."""
    from functools import partial

    from rarelm.params import load_params
    from rarelm.progress import Steps
    from rarelm.rare_terms import stage as rare_stage

    lines: list[str] = []
    monkeypatch.setattr(rare_stage, "Steps", partial(Steps, quiet=0.0, log=lines.append))
    params = load_params(work / "params.yaml")
    (tmp_path / "out").mkdir()
    metrics = rare_stage.rare_terms(params.rare, params.corpus.reference_glossary, work / "data/prepared",
                                    work / "data/tokenized", tmp_path / "out")
    train = json.loads((work / "data/tokenized/meta.json").read_text())["splits"]["train"]
    took = r"([0-9]+\.[0-9] s|[0-9]+ min [0-9]+ s)"
    parts = [re.fullmatch(rf"(.*) {took} \({took} so far\)", line).group(1) for line in lines]
    assert parts == [f"rare_terms: reading {metrics['documents']:,} documents",
                     f"rare_terms: TF-IDF terms ({metrics['tfidf_terms']:,})",
                     f"rare_terms: the term list ({metrics['terms']:,} terms)",
                     f"rare_terms: counting {train['tokens']:,} train tokens",
                     "rare_terms: scoring the extraction against the reference glossary",
                     f"rare_terms: finding the terms' {metrics['term_occurrences']:,} train occurrences",
                     "rare_terms: the term list's quality on the test split"], lines


def test_stage_outputs(work, tiny_raw):
    glossary = work / "glossary.txt"
    # the demo's commonest term: in too many documents for max_df, kept as a glossary term
    glossary.write_text("Renal colic\nIdiopathic Pneumomyositis\n", encoding="utf-8")
    set_params(work, **{"rare.glossary": "glossary.txt"})
    result = stage("rare_terms", work, check=True)
    assert result.stdout.startswith("rare_terms: buckets frequent") and "F1" in result.stdout
    meta = json.loads((work / "data/tokenized/meta.json").read_text())
    counts = np.load(work / "data/rare/counts.npy")
    buckets = np.load(work / "data/rare/buckets.npy")
    assert counts.dtype == np.int64 and counts.shape == (meta["vocab_size"],)
    assert counts.sum() == meta["splits"]["train"]["tokens"]
    assert buckets.dtype == np.int8 and buckets.shape == counts.shape
    assert set(np.unique(buckets).tolist()) <= {0, 1, 2, 3}
    assert ((buckets == 3) == (counts == 0)).all()
    assert counts[buckets == 0].min() > counts[buckets == 1].max() > counts[buckets == 1].min() \
        > counts[buckets == 2].max()
    rows = [json.loads(line) for line in (work / "data/rare/terms.jsonl").read_text().splitlines()]
    assert set(rows[0]) == {"term", "source", "count", "df", "idf", "score", "token_ids",
                            "train_occurrences", "display", "surface_forms"}
    assert [(r["term"], r["source"]) for r in rows[:2]] == [
        ("Idiopathic Pneumomyositis", "glossary"), ("Renal colic", "glossary")]  # by score
    assert rows[0]["df"] > 6 and rows[0]["count"] >= 2 * rows[0]["df"]
    assert (rows[1]["count"], rows[1]["df"], rows[1]["score"]) == (0, 0, 0.0)
    metrics = json.loads((work / "metrics/rare_terms.json").read_text())
    assert sum(r["source"] == "tfidf" for r in rows) == len(rows) - 2 == metrics["tfidf_terms"] > 20
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(work / "data/tokenized/tokenizer/tokenizer.json"))
    for row in rows:  # of the display form: the glossary's capitals are not how train writes them
        assert row["token_ids"][0] == tok.encode(row["display"]).ids
        assert tok.encode(" " + row["display"]).ids in row["token_ids"]
    # as train writes it; a term train never has stays as the glossary gives it
    assert [(r["display"], r["train_occurrences"] > 0) for r in rows[:2]] == [
        ("idiopathic pneumomyositis", True), ("Renal colic", False)]
    reference = read_reference(tiny_raw / "demo_en.glossary.tsv")
    extracted = [r["term"] for r in rows if r["source"] == "tfidf"]
    assert metrics["extraction"] == pytest.approx(
        {**extraction_scores(extracted, reference),
         "reference_in_train": metrics["extraction"]["reference_in_train"]})
    assert metrics["extraction"]["f1"] > 0.8  # tiny corpus: 40 terms, some seen once or never
    assert metrics["buckets"]["rare"]["share"] <= 0.05 <= metrics["buckets"]["frequent"]["share"] - 0.75
    quality = metrics["term_list_quality"]  # its figures by hand: tests/test_quality.py
    assert sum(quality["terms_by_train_count"].values()) == len(rows)
    assert quality["test_matches"] >= quality["test_occurrences"] > 0
    # rare.tfidf: false: the glossary supplies every term
    set_params(work, **{"rare.tfidf": False})
    stage("rare_terms", work, check=True)
    rows = [json.loads(line) for line in (work / "data/rare/terms.jsonl").read_text().splitlines()]
    assert [r["source"] for r in rows] == ["glossary", "glossary"]


@pytest.mark.parametrize(("setup", "message"), [
    ({"rare.glossary": "empty.txt"}, "rare.glossary: empty.txt holds no term"),
    ({"rare.glossary": "gbk.txt"}, "rare.glossary: gbk.txt is not valid UTF-8"),
    ({"rare.glossary": "missing.txt"}, "rare.glossary: no such file: missing.txt"),
    ({"rare.rare_share": 1e-6}, "leave the rare bucket empty"),
    ({"rare.frequent_share": 1.5}, "rare.frequent_share = 1.5 is not allowed"),
    ({"rare.tfidf": False}, "rare.tfidf: false leaves no term without a rare.glossary"),
    ({"vocab": "meta"}, "the vocabulary does not match the tokenized data"),
    ({"vocab": "tokens"}, "outside the vocabulary"),
])
def test_bad_input_is_one_line_and_leaves_nothing(work, setup, message):
    (work / "empty.txt").write_text("\n", encoding="utf-8")
    (work / "gbk.txt").write_bytes("质押式回购\n".encode("gbk"))
    if setup.get("vocab") == "meta":  # tokenized data claiming another vocabulary
        meta = json.loads((work / "data/tokenized/meta.json").read_text())
        meta["vocab_size"] += 7
        (work / "data/tokenized/meta.json").write_text(json.dumps(meta))
    elif setup.get("vocab") == "tokens":  # a token id the tokenizer does not have
        with open(work / "data/tokenized/train.tokens", "r+b") as f:
            f.write(np.array([60000], dtype="<u2").tobytes())
    else:
        set_params(work, **setup)
    result = stage("rare_terms", work)
    assert_user_error(result, message, work, "data/rare", "metrics/rare_terms.json",
                      stage="rare_terms")
    assert not list((work / "data").glob(".rare*"))  # no temporary folder left either


def _special_input(work, kind: str) -> str:
    """A path of `kind` for a glossary param: a named pipe nobody writes, /dev/zero, or a sparse
    file past the 256 MiB a stage reads whole (no disk used)."""
    if kind == "fifo":
        os.mkfifo(work / "pipe.txt")
        return "pipe.txt"
    if kind == "device":
        return "/dev/zero"
    with open(work / "huge.txt", "wb") as f:
        f.truncate(300 * 2**20)
    return "huge.txt"


@pytest.mark.parametrize("key", ["rare.glossary", "corpus.reference_glossary"])
@pytest.mark.parametrize(("kind", "message"), [
    ("fifo", "pipe.txt is a named pipe (FIFO), not a file; point it at a regular file"),
    ("device", "/dev/zero is a character device, not a file; point it at a regular file"),
    ("big", "huge.txt is 314,572,800 bytes, larger than the 268,435,456 bytes a stage reads whole")])
def test_a_glossary_that_is_no_regular_file_or_too_big_is_refused_before_it_is_read(work, key, kind,
                                                                                     message):
    """Issue 56 row 9: `rare.glossary` or `corpus.reference_glossary` = /dev/zero was read until
    memory ran out, = a FIFO hung the stage for good. Now both are refused in one line before any
    read, as a file past the size limit is. (The address-space limit turns the old unbounded read
    into a MemoryError, and the subprocess timeout the old hang into a failure.)"""
    set_params(work, **{key: _special_input(work, kind)})
    result = subprocess.run([sys.executable, "-m", "stages.rare_terms"], cwd=work, capture_output=True,
                            text=True, timeout=300, env={**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"},
                            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (6 * 2**30,) * 2))
    assert_user_error(result, f"{key}: {message}", work, "data/rare", "metrics/rare_terms.json",
                      stage="rare_terms")


# ------------------------------------------------------------------ where terms occur in the train split


def brute_force_index(documents: list[str], tokenizer, offsets: np.ndarray, terms: list[str]) -> np.ndarray:
    """The term index by case-insensitive regular expressions over each document, mapped to tokens
    by their offsets."""
    import re

    rows = []
    for d, text in enumerate(documents):
        spans = tokenizer.encode(text, add_special_tokens=False).offsets
        for t, term in enumerate(terms):
            for m in re.finditer(r"(?<![^\W_])" + re.escape(term) + r"(?![^\W_])", text, re.IGNORECASE):
                covering = [k for k, (a, b) in enumerate(spans) if a < m.end() and b > m.start()]
                rows.append((int(offsets[d]) + covering[0], len(covering), t))
    index = np.array(sorted(rows, key=lambda r: (r[0], r[2])), dtype=np.int64)
    return index.reshape(-1, 3)


def test_term_index_equals_a_brute_force_scan_across_batch_borders(work):

    stage("rare_terms", work, check=True)
    data = TokenizedData.open(work / "data/tokenized")
    tokenizer = load_tokenizer(data.tokenizer_dir, data.vocab_size)
    terms = [json.loads(line)["term"] for line in (work / "data/rare/terms.jsonl").read_text().splitlines()]
    documents = list(read_split(work / "data/prepared", "train"))
    expected = brute_force_index(documents, tokenizer, data.offsets("train"), terms)
    assert len(expected) > 100
    stored = np.load(work / "data/rare/term_index.npy")
    assert stored.tolist() == expected.tolist()
    for batch in (1, 7):  # documents per search batch: many borders
        built, _ = build_term_index(tokenizer, work / "data/prepared", data, terms,
                                    batch_documents=batch)
        assert built.tolist() == expected.tolist()
    rows = [json.loads(line) for line in (work / "data/rare/terms.jsonl").read_text().splitlines()]
    found = np.bincount(expected[:, 2], minlength=len(terms))
    assert [r["train_occurrences"] for r in rows] == found.tolist()
    index = TermIndex.open(work / "data/rare", data)
    assert index.max_length == expected[:, 1].max()
    metrics = json.loads((work / "metrics/rare_terms.json").read_text())
    assert metrics["term_occurrences"] == len(expected)


def test_target_mask_equals_a_dense_mask():
    rng = np.random.default_rng(0)
    starts = np.sort(rng.integers(0, 500, 60))
    rows = np.stack([starts, rng.integers(1, 5, 60), rng.integers(0, 9, 60)], axis=1)
    dense = np.zeros(520, dtype=bool)
    for s, n, _ in rows.tolist():
        dense[s:s + n] = True
    index = TermIndex(rows, max_length=4)
    windows = rng.integers(0, 480, 40)
    mask = index.target_mask(windows, block_size=16)
    assert mask.tolist() == [dense[w + 1:w + 17].tolist() for w in windows.tolist()]


@pytest.mark.parametrize(("change", "what"), [
    ("terms", "terms.jsonl"), ("tokenizer", "tokenizer"), ("index", "row count"), ("missing", None),
])
def test_term_index_that_does_not_match_is_refused(work, change, what):

    stage("rare_terms", work, check=True)
    rare_dir = work / "data/rare"
    if change == "terms":
        with open(rare_dir / "terms.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"term": "added by hand", "count": 2}) + "\n")
    elif change == "tokenizer":
        path = work / "data/tokenized/tokenizer/tokenizer.json"
        path.write_text(path.read_text() + "\n")
    elif change == "index":
        np.save(rare_dir / "term_index.npy", np.load(rare_dir / "term_index.npy")[:-1])
    else:
        (rare_dir / "term_index.npy").unlink()
    with pytest.raises(RarelmError, match="re-run the rare_terms stage") as caught:
        TermIndex.open(rare_dir, TokenizedData.open(work / "data/tokenized"))
    if what:
        assert f"not built from the current {what}" in str(caught.value)


# ------------------------------------------------------------------ terms whatever their case, on real text

# Real mixed-case technical English (libpng's manual; source and licence in tests/data/README.md)
EXCERPT = REPO / "tests/data/libpng_manual_excerpt.txt"


@pytest.fixture(scope="module")
def real_text(tmp_path_factory):
    """prepare, tokenize and rare_terms run in process on the real-text excerpt, one document
    per paragraph; TF-IDF limits opened up so that its few documents yield terms."""
    from rarelm.files import write_json
    from rarelm.params import CorpusParams, RareParams, TokenizerParams
    from rarelm.prepare import corpus
    from rarelm.tokenize import tokenization

    root = tmp_path_factory.mktemp("real_text")
    prepared, tokenized, out = root / "prepared", root / "tokenized", root / "rare"
    for folder in (prepared, tokenized, out):
        folder.mkdir()
    write_json(prepared / "stats.json", corpus.prepare(
        CorpusParams(path=str(EXCERPT), txt_documents="blank_line", reference_glossary=""), prepared))
    write_json(tokenized / "meta.json", tokenization.tokenize(TokenizerParams(vocab_size=600), prepared,
                                                              tokenized))
    metrics = rare_terms(RareParams(max_df=1.0, min_mean_tf=1.0), "", prepared, tokenized, out)
    return root, metrics


def test_real_text_index_equals_a_case_insensitive_brute_force(real_text):

    root, metrics = real_text
    rows = [json.loads(line) for line in (root / "rare/terms.jsonl").read_text().splitlines()]
    terms = [r["term"] for r in rows]
    data = TokenizedData.open(root / "tokenized")
    tokenizer = load_tokenizer(data.tokenizer_dir, data.vocab_size)
    documents = list(read_split(root / "prepared", "train"))
    expected = brute_force_index(documents, tokenizer, data.offsets("train"), terms)
    assert np.load(root / "rare/term_index.npy").tolist() == expected.tolist()
    found = np.bincount(expected[:, 2], minlength=len(terms))
    assert [r["train_occurrences"] for r in rows] == found.tolist()
    assert len(rows) >= 20 and metrics["terms_found_in_train"] == len(rows)  # none unfound
    # the text writes terms in capitals: each form counted as written, the commonest shown
    by_term = {r["term"]: r for r in rows}
    assert [by_term[t]["display"] for t in ("api", "apis", "iso", "png files", "libpng")] == \
        ["API", "APIs", "ISO", "PNG files", "libpng"]
    assert by_term["libpng"]["surface_forms"] == {"libpng": 24, "Libpng": 5}
    assert by_term["png"]["surface_forms"] == {"png": 35, "PNG": 16}  # png.h, png_struct: "png"
    for r in rows:
        assert sum(r["surface_forms"].values()) == r["train_occurrences"]
        assert r["display"] == max(r["surface_forms"], key=r["surface_forms"].get)
        assert {f.casefold() for f in r["surface_forms"]} == {r["term"].casefold()}
        assert r["token_ids"][0] == tokenizer.encode(r["display"], add_special_tokens=False).ids


def test_surface_and_display_forms():
    from collections import Counter

    forms = Counter({"pki": 2, "PKI": 5, "Pki": 2})
    assert surface_forms(forms) == {"PKI": 5, "Pki": 2, "pki": 2}
    assert list(surface_forms(forms)) == ["PKI", "Pki", "pki"]  # a tie: code-point order
    assert display_form("pki", forms) == "PKI"
    assert display_form("real programmers", Counter({"Real Programmers": 3, "real programmers": 1})) \
        == "Real Programmers"
    assert display_form("pki", Counter()) == "pki"  # never in train: as extracted


def test_tfidf_over_all_splits_finds_terms_unseen_in_train_and_keeps_train_counts(work):
    """rare.tfidf_all_splits: TF-IDF also reads the val and test documents, so terms that train holds
    once or never can be extracted (evaluate's "seen 0-1" stratum); a term's count stays train's."""
    def terms() -> dict[str, int]:
        stage("rare_terms", work, check=True)
        rows = [json.loads(line) for line in (work / "data/rare/terms.jsonl").read_text().splitlines()]
        return {r["term"]: r["train_occurrences"] for r in rows if r["source"] == "tfidf"}

    train_only = terms()
    set_params(work, **{"rare.tfidf_all_splits": True})
    every_split = terms()
    held_out = "\n".join(d for s in ("val", "test") for d in read_split(work / "data/prepared", s)).lower()
    new = {t: n for t, n in every_split.items() if t not in train_only}
    assert any(n <= 1 for n in new.values()), new
    assert all(t.lower() in held_out for t, n in new.items() if n == 0)  # found in val/test only
    assert all(every_split[t] == n for t, n in train_only.items() if t in every_split)


def test_zh_fragment_is_judged_on_every_split_tfidf_reads(tmp_path):
    """A Chinese TF-IDF candidate whole in train but inside a longer word elsewhere: with
    rare.tfidf_all_splits the fragment test reads the same documents TF-IDF read, so 分区 (whole
    in train, inside 分区表 in val/test) is dropped; on train alone it stays a term."""
    from rarelm.prepare.corpus import split_of
    filler = [line for line in (REPO / "data/general/zh.txt").read_text().splitlines() if line][:120]
    pages = [f"p{i}" for i in range(400)]
    train = [p for p in pages if split_of(p, 1337, 0.1, 0.1) == "train"][:4]
    held_out = [p for p in pages if split_of(p, 1337, 0.1, 0.1) != "train"][:6]
    rows = [{"page": p, "text": f"{filler[i]}请先创建一个分区，然后格式化这个分区。"}
            for i, p in enumerate(train)]
    rows += [{"page": p, "text": f"{filler[10 + i]}分区表损坏时，请备份分区表，再修复分区表，检查分区表。"}
             for i, p in enumerate(held_out)]
    rows += [{"page": f"f{i}", "text": text} for i, text in enumerate(filler[20:])]
    corpus = tmp_path / "pages.jsonl"
    corpus.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    set_params(tmp_path, **{"corpus.path": str(corpus), "corpus.language": "zh", "corpus.group_field": "page",
                            "corpus.reference_glossary": "", "tokenizer.vocab_size": 512})
    for name in ("prepare", "tokenize"):
        stage(name, tmp_path, check=True)

    def terms(all_splits: bool) -> set[str]:
        set_params(tmp_path, **{"rare.tfidf_all_splits": all_splits})
        stage("rare_terms", tmp_path, check=True)
        lines = (tmp_path / "data/rare/terms.jsonl").read_text(encoding="utf-8").splitlines()
        return {json.loads(line)["term"] for line in lines}

    assert "分区" in terms(all_splits=False)      # whole in every train document
    assert "分区" not in terms(all_splits=True)   # 8 whole, 24 inside 分区表 over all splits
