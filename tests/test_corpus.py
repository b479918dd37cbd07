import dataclasses
import gzip
import hashlib
import json
import re
import shutil
import subprocess
import sys

import pytest

from rarelm.errors import RarelmError
from rarelm.params import CorpusParams
from rarelm.prepare import corpus
from tests.conftest import REPO, set_params


def params(path, **kw) -> CorpusParams:
    return dataclasses.replace(CorpusParams(), path=str(path), reference_glossary="", **kw)


def test_clean_removes_ansi_controls_and_collapses_space():
    assert corpus.clean("\x1b[1;31mRed\x1b[0m\ttext\x00\x07  here\r\n") == "Red text here"
    assert corpus.clean("\x1b]0;title\x07x") == "x"
    # NFC composes e + combining acute into one code point
    assert corpus.clean("caf\u0065\u0301") == "caf\u00e9"
    assert corpus.clean("心肌　梗死") == "心肌 梗死"  # ideographic space is whitespace


def test_split_is_stable_and_proportional():
    docs = [f"document number {i}" for i in range(20000)]
    splits = [corpus.split_of(d, 7, 0.1, 0.2) for d in docs]
    assert splits == [corpus.split_of(d, 7, 0.1, 0.2) for d in docs]
    assert abs(splits.count("val") / 20000 - 0.1) < 0.01
    assert abs(splits.count("test") / 20000 - 0.2) < 0.01
    # adding documents never moves existing ones; another seed reshuffles
    assert corpus.split_of(docs[5], 7, 0.1, 0.2) == splits[5]
    other = [corpus.split_of(d, 8, 0.1, 0.2) for d in docs]
    assert other != splits


@pytest.mark.parametrize("gz", [False, True])
def test_formats_read_the_same_documents(tmp_path, gz):
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = ["first doc", "second, with \"quotes\"", "第三个文档"]
    opener = (lambda p: gzip.open(p, "wt", encoding="utf-8")) if gz else \
        (lambda p: open(p, "w", encoding="utf-8"))
    suffix = ".gz" if gz else ""
    with opener(tmp_path / f"a.txt{suffix}") as f:
        f.write("\n".join(texts) + "\n")
    with opener(tmp_path / f"b.jsonl{suffix}") as f:
        f.write("".join(json.dumps({"body": t, "id": i}) + "\n" for i, t in enumerate(texts)))
    import csv
    with opener(tmp_path / f"c.csv{suffix}") as f:
        w = csv.writer(f)
        w.writerow(["id", "body"])
        w.writerows([[i, t] for i, t in enumerate(texts)])
    pq.write_table(pa.table({"body": texts}), tmp_path / "d.parquet")
    for name in (f"a.txt{suffix}", f"b.jsonl{suffix}", f"c.csv{suffix}", "d.parquet"):
        got = list(corpus.iter_documents(params(tmp_path / name, text_field="body")))
        assert got == texts, name
    folder = list(corpus.iter_documents(params(tmp_path, text_field="body")))
    assert folder == texts * 4


def test_blank_line_documents(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("para one\nstill one\n\n\npara two\n", encoding="utf-8")
    docs = [corpus.clean(d) for d in corpus.iter_documents(params(path, txt_documents="blank_line"))]
    assert docs == ["para one still one", "para two"]


def test_prepare_dedups_drops_empty_and_writes_splits(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("alpha doc\n\n  \nalpha  doc\nbeta doc\n\x1b[0m\n", encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    stats = corpus.prepare(params(path, val_fraction=0.0, test_fraction=0.0), out)
    assert stats["train"] == {"documents": 2, "characters": 17}
    assert stats["duplicates"] == 1 and stats["dropped_short"] == 3
    assert list(corpus.read_split(out, "train")) == ["alpha doc", "beta doc"]
    assert stats["language"] == "en"


def test_detect_language():
    assert corpus.detect_language(["公司公告称，报告期内营业收入下降"]) == "zh"
    assert corpus.detect_language(["The patient reported fever"]) == "en"


@pytest.mark.parametrize(("setup", "message"), [
    (lambda p: None, "no such file or folder"),
    (lambda p: p.write_bytes(b""), "holds no document after cleaning"),
    (lambda p: p.write_bytes(b"ok line\nbad \xff byte\n"), "line 2 (byte 12) is not valid UTF-8"),
])
def test_bad_corpus_errors(tmp_path, setup, message):
    path = tmp_path / "c.txt"
    setup(path)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(RarelmError, match=message.replace("(", r"\(").replace(")", r"\)")):
        corpus.prepare(params(path), out)


def test_invalid_utf8_can_be_replaced(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes(b"bad \xff byte\n")
    docs = list(corpus.iter_documents(params(path, encoding_errors="replace")))
    assert docs == ["bad \ufffd byte"]


def test_unsupported_format_and_missing_field(tmp_path):
    (tmp_path / "c.docx").write_text("x")
    with pytest.raises(RarelmError, match="unsupported format 'c.docx'"):
        corpus.corpus_files(params(tmp_path / "c.docx"))
    (tmp_path / "d.jsonl").write_text('{"body": "x"}\n')
    with pytest.raises(RarelmError, match="line 1 has no field 'text'"):
        list(corpus.iter_documents(params(tmp_path / "d.jsonl")))


DOCS = "".join(f"document number {i} with some words\n" for i in range(2000)).encode()
GZ = gzip.compress(DOCS, mtime=0)


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]


@pytest.mark.parametrize(("name", "data", "message"), [
    ("c.txt.gz", GZ[: len(GZ) // 2],
     r"c\.txt\.gz: truncated gzip file after \d+ lines \(Compressed file ended"),
    ("c.jsonl.gz", gzip.compress(b'{"text": "x"}\n' * 500, mtime=0)[:-12], "c.jsonl.gz: truncated gzip file"),
    ("c.csv.gz", gzip.compress(b"text\n" + DOCS, mtime=0)[:200], "c.csv.gz: truncated gzip file"),
    ("c.txt.gz", _flip(GZ, 40),
     r"c\.txt\.gz: corrupt gzip file after 0 lines \(Error -3 while decompressing"),
    ("c.txt.gz", _flip(GZ, len(GZ) - 8),
     r"c\.txt\.gz: corrupt gzip file after 2000 lines \(CRC check failed"),
])
def test_truncated_or_corrupt_gzip_names_the_file_and_the_damage(tmp_path, name, data, message):
    """gzip finds the damage while reading, not at open (EOFError, which Typer would print as
    a bare `Aborted.`, zlib.error, BadGzipFile): each is one RarelmError naming the file."""
    (tmp_path / name).write_bytes(data)
    with pytest.raises(RarelmError, match=message) as info:
        list(corpus.iter_documents(params(tmp_path / name)))
    assert "\n" not in str(info.value)


def test_corrupt_parquet_page_names_the_file(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "c.parquet"
    texts = [f"document {i} " * 20 for i in range(3000)]
    pq.write_table(pa.table({"text": texts}), path, compression="snappy", row_group_size=500)
    data = bytearray(path.read_bytes())
    data[len(data) // 2: len(data) // 2 + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))
    with pytest.raises(RarelmError, match=r"c\.parquet: (corrupt parquet data|not a readable parquet)"):
        list(corpus.iter_documents(params(path)))


# --------------------------------------------------------------------------- bounded memory, odd input

def _prepare_cli(tmp_path, corpus_path, preexec_fn=None, **corpus_params) -> subprocess.CompletedProcess:
    """The prepare stage on `corpus_path` (outputs under tmp_path), run from the repository."""
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    set_params(tmp_path, **{"corpus.path": str(corpus_path)},
               **{f"corpus.{k}": v for k, v in corpus_params.items()})
    return subprocess.run(
        [sys.executable, "-m", "stages.prepare", "--params", str(tmp_path / "params.yaml"),
         "--out", str(tmp_path / "prepared"), "--metrics", str(tmp_path / "prepare.json")],
        cwd=REPO, capture_output=True, text=True, preexec_fn=preexec_fn, timeout=300)


def test_gzip_bomb_of_one_line_under_a_memory_limit_is_one_line(tmp_path):
    """A 1 MB gzip that expands to 1 GiB without a newline (1024 gzip members of 1 MiB each),
    read with 512 MB of address space: refused at corpus.max_line_bytes (16 MiB) in one line,
    where reading the line whole died with a MemoryError traceback."""
    import resource

    bomb = tmp_path / "bomb.txt.gz"
    bomb.write_bytes(gzip.compress(b"a" * 2**20, mtime=0) * 1024)
    assert bomb.stat().st_size < 2**21

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (512 * 2**20, 512 * 2**20))

    result = _prepare_cli(tmp_path, bomb, preexec_fn=limit)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip() == (f"rarelm prepare: error: {bomb}: line 1 is longer than "
                                     "corpus.max_line_bytes = 16777216 bytes; split it into documents "
                                     "or raise the limit")
    assert not (tmp_path / "prepared").exists()


def test_long_lines_and_documents_are_refused_at_the_limit(tmp_path):
    ok, long = "x" * 1024, "y" * 1025
    path = tmp_path / "c.txt"
    path.write_text(f"{ok}\n{long}\n", encoding="utf-8")
    assert list(corpus.iter_documents(params(path, max_line_bytes=1025))) == [ok, long]
    with pytest.raises(RarelmError, match=r"c\.txt: line 2 is longer than corpus.max_line_bytes = 1024"):
        list(corpus.iter_documents(params(path, max_line_bytes=1024)))
    path.write_text("short\n" * 300 + "\n", encoding="utf-8")  # one paragraph of 1800 bytes
    with pytest.raises(RarelmError, match="the document at line 171 is longer than"):
        list(corpus.iter_documents(params(path, txt_documents="blank_line", max_line_bytes=1024)))
    csv_path = tmp_path / "c.csv"
    csv_path.write_text('text\n"' + "z\n" * 600 + '"\n', encoding="utf-8")  # one field over 8 lines
    with pytest.raises(RarelmError, match=r"c\.csv: line \d+: field larger than field limit \(1024\)"):
        list(corpus.iter_documents(params(csv_path, max_line_bytes=1024)))


def test_dedup_table_holds_8_byte_digests_at_most_two_thirds_full():
    seen = corpus.SeenDigests(capacity=1024)
    digests = [hashlib.blake2b(str(i).encode(), digest_size=8).digest() for i in range(5000)]
    assert all(seen.add(d) for d in digests)
    assert not any(seen.add(d) for d in digests[::7])
    assert len(seen) == 5000 and seen.slots.itemsize == 8 and len(seen.slots) == 8192
    assert seen.add(bytes(8)) and not seen.add(b"\x01" + bytes(7))  # 0 is stored as 1


def test_lone_surrogate_in_jsonl_is_replaced_or_refused_in_one_line(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "ok"}\n{"text": "bad \\ud800 one"}\n', encoding="utf-8")
    result = _prepare_cli(tmp_path, path, encoding_errors="replace", val_fraction=0.0,
                          test_fraction=0.0)
    assert result.returncode == 0, result.stderr[-3000:]
    assert list(corpus.read_split(tmp_path / "prepared", "train")) == ["ok", "bad \ufffd one"]
    result = _prepare_cli(tmp_path, path)
    assert result.returncode == 2 and result.stderr.strip() == (
        f"rarelm prepare: error: {path}: line 2: field 'text' holds a lone surrogate escape (\\ud800), "
        "which is no character; fix the file or set corpus.encoding_errors: replace")


@pytest.mark.parametrize(("value", "kind"), [("5", "a number"), ('{"a": 1}', "an object"),
                                             ("[1]", "a list"), ("true", "a boolean")])
def test_non_string_jsonl_value_is_one_line_naming_the_line(tmp_path, value, kind):
    path = tmp_path / "c.jsonl"
    path.write_text(f'{{"text": "fine"}}\n{{"text": null}}\n{{"text": {value}}}\n', encoding="utf-8")
    result = _prepare_cli(tmp_path, path)
    assert result.returncode == 2 and result.stderr.strip() == (
        f"rarelm prepare: error: {path}: line 3: field 'text' is {kind}, not a string")
    assert not (tmp_path / "prepared").exists()


def test_folder_corpus_skips_links_that_leave_it(tmp_path):
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("a document inside\n", encoding="utf-8")
    secret = tmp_path / "secret.txt"  # outside the folder and the repository
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n", encoding="utf-8")
    (folder / "passwd.txt").symlink_to(secret)
    (folder / "sub" / "same.txt").symlink_to(folder / "a.txt")  # inside: read
    result = _prepare_cli(tmp_path, folder, val_fraction=0.0, test_fraction=0.0, dedup=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.strip() == (f"rarelm prepare: warning: skipping {folder / 'passwd.txt'}: a link "
                                     f"to {secret}, outside the corpus folder and the repository")
    assert list(corpus.read_split(tmp_path / "prepared", "train")) == ["a document inside"] * 2


@pytest.mark.parametrize("later_quote", [True, False], ids=["a-later-quote", "none-till-the-end"])
def test_a_csv_with_an_unclosed_quote_is_refused_naming_its_line(tmp_path, later_quote):
    """Issue 56 row 12: one unclosed quote ran its field on through the lines after it (149 rows
    merged into one document of 163,907 characters, silently). Now the CSV is read strictly and
    the line where the broken record starts is named. A quoted field over several lines, with
    doubled quotes inside, is still one document."""
    rows = ["text,id", "first document,1", '"an unclosed document,2']
    rows += [f"document number {i},{i}" for i in range(3, 152)]
    rows += ['"a quoted, fine document",152'] if later_quote else []
    path = tmp_path / "broken.csv"
    path.write_text("\n".join(rows) + "\n")
    result = _prepare_cli(tmp_path, path, val_fraction=0.0, test_fraction=0.0)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"rarelm prepare: error: {path}: line 3: a quoted field is not closed where "
                           "it should be (")
    assert line.endswith("so its record would run on through the lines after it; close the quote, or "
                         'double a quote inside a quoted field ("")')
    assert not (tmp_path / "prepared").exists()
    good = tmp_path / "good.csv"
    good.write_text('text,id\n"a ""quoted"" word\nover two lines",1\nplain,2\n')
    assert _prepare_cli(tmp_path, good, val_fraction=0.0, test_fraction=0.0, dedup=False).returncode == 0
    assert list(corpus.read_split(tmp_path / "prepared", "train")) == ['a "quoted" word over two lines',
                                                                       "plain"]


def test_a_jsonl_line_nested_100000_deep_is_one_line_naming_it(tmp_path):
    """Issue 56 row 10: was an 83-line RecursionError traceback, exit 1."""
    path = tmp_path / "deep.jsonl"
    path.write_text('{"text": "a first document"}\n{"text": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    result = _prepare_cli(tmp_path, path)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert re.fullmatch(rf"rarelm prepare: error: {re.escape(str(path))}: line 2 is JSON nested deeper than "
                        r"can be read \(more than about \d+ levels\); a line is one object with the text in "
                        r"'text'", line), line
    assert not (tmp_path / "prepared").exists() and not (tmp_path / "prepare.json").exists()


@pytest.mark.parametrize(("written", "warning"), [
    ("data/corpus.txt", "data/corpus.txt lies outside the repository (it leads to {outside})"),
    ("../elsewhere/corpus.txt", "../elsewhere/corpus.txt lies outside the repository;"),
    ("{outside}", None)], ids=["link", "dots", "absolute"])
def test_a_corpus_path_that_leads_out_of_the_repository_is_read_with_one_warning(tmp_path, written,
                                                                                  warning):
    """Issue 56 row 8: corpus.path a link in the repository to a file outside it, or `../` out of
    it (`../../../../etc/passwd`), was read into data/prepared without a word. Now one warning line
    names it and where it leads, and it is read; an absolute path outside the repository is taken
    as meant (corpora often live elsewhere): no warning."""
    repo, outside = tmp_path / "repo", tmp_path / "elsewhere" / "corpus.txt"
    (repo / "data").mkdir(parents=True)
    outside.parent.mkdir()
    outside.write_text("root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1::/usr/sbin:/usr/sbin/nologin\n")
    (repo / "data/corpus.txt").symlink_to(outside)
    shutil.copy(REPO / "params.yaml", repo / "params.yaml")
    set_params(repo, **{"corpus.path": written.format(outside=outside), "corpus.val_fraction": 0.0,
                        "corpus.test_fraction": 0.0})
    result = subprocess.run([sys.executable, "-m", "stages.prepare"], cwd=repo, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    if warning is None:
        assert result.stderr == ""
    else:
        assert result.stderr.startswith("rarelm prepare: warning: corpus.path: "
                                        + warning.format(outside=outside)), result.stderr
        assert result.stderr.endswith("reading it: what it holds goes into this stage's outputs\n")
        assert len(result.stderr.splitlines()) == 1
    assert len(list(corpus.read_split(repo / "data/prepared", "train"))) == 2


# ------------------------------------------------------------------ splits that keep a group whole


def _split_digests(out) -> dict:
    return {s: hashlib.sha256((out / f"{s}.jsonl").read_bytes()).hexdigest()[:16] for s in corpus.SPLITS}


@pytest.mark.parametrize(("name", "digests"), [
    ("demo_en.txt.gz", {"train": "6710e8d009712b26", "val": "ff762fcf160964af", "test": "143f08073cc822b6"}),
    ("demo_zh.txt.gz", {"train": "53ef9b1c75a08ede", "val": "967e7e46b42c4c41", "test": "845d1103fbefc598"}),
])
def test_no_group_field_reproduces_the_split_before_groups_bit_for_bit(tmp_path, name, digests):
    """The digests are of the splits the code made before corpus.group_field existed (2026-12-03)."""
    stats = corpus.prepare(params(REPO / "data/raw" / name), tmp_path)
    assert _split_digests(tmp_path) == digests
    assert "groups" not in stats["train"]


def _grouped_corpus(path, n_groups=60, per_group=5):
    """jsonl documents "g<k> section <i>", group "page<k>"; every 7th group is null (own groups)."""
    with open(path, "w", encoding="utf-8") as f:
        for k in range(n_groups):
            for i in range(per_group):
                group = None if k % 7 == 0 else f"page{k}"
                f.write(json.dumps({"text": f"g{k} section {i}", "page": group}) + "\n")


def test_a_group_is_never_split_across_train_val_and_test(tmp_path):
    path = tmp_path / "c.jsonl"
    _grouped_corpus(path)
    out = tmp_path / "out"
    out.mkdir()
    stats = corpus.prepare(params(path, group_field="page", val_fraction=0.2, test_fraction=0.2), out)
    where: dict[str, set[str]] = {}
    for split in corpus.SPLITS:
        for text in corpus.read_split(out, split):
            k = int(text.split()[0][1:])
            if k % 7:
                where.setdefault(f"page{k}", set()).add(split)
                # the split is the group's: a hash of its name with the seed
                assert split == corpus.split_of(f"page{k}", 1337, 0.2, 0.2)
            else:  # no group: each document by its own text, as without group_field
                assert split == corpus.split_of(text, 1337, 0.2, 0.2)
    assert all(len(splits) == 1 for splits in where.values()) and len(where) == 51
    assert {s for splits in where.values() for s in splits} == set(corpus.SPLITS)
    # 51 named groups + 9 x 5 documents without a group, each a group of its own
    assert sum(stats[s]["groups"] for s in corpus.SPLITS) == 51 + 45
    # the same corpus without group_field: documents of one page land in different splits
    flat = tmp_path / "flat"
    flat.mkdir()
    corpus.prepare(params(path, val_fraction=0.2, test_fraction=0.2), flat)
    split_of_doc = {t: s for s in corpus.SPLITS for t in corpus.read_split(flat, s)}
    assert any(len({split_of_doc[f"g{k} section {i}"] for i in range(5)}) > 1 for k in range(60))


def test_group_column_in_csv_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [("one a", "p1"), ("one b", "p1"), ("two a", 2), ("solo", None)]
    with open(tmp_path / "c.csv", "w", encoding="utf-8", newline="") as f:
        f.write("text,book\n" + "".join(f"{t},{'' if g is None else g}\n" for t, g in rows))
    books = [None if g is None else str(g) for _, g in rows]
    pq.write_table(pa.table({"text": [t for t, _ in rows], "book": books}), tmp_path / "c.parquet")
    expected = [("one a", "p1"), ("one b", "p1"), ("two a", "2"), ("solo", None)]
    for name in ("c.csv", "c.parquet"):
        assert list(corpus.iter_grouped(params(tmp_path / name, group_field="book"))) == expected
    # an integer id in jsonl is a group too
    (tmp_path / "d.jsonl").write_text('{"text": "x", "id": 7}\n')
    assert list(corpus.iter_grouped(params(tmp_path / "d.jsonl", group_field="id"))) == [("x", "7")]


@pytest.mark.parametrize(("name", "content", "message"), [
    ("c.txt", "a line\n", "corpus.group_field: .*plain text, which has no fields"),
    ("c.jsonl", '{"text": "x"}\n', "line 1 has no field 'page' \\(set corpus.group_field\\)"),
    ("c.jsonl", '{"text": "x", "page": true}\n', "line 1: group field 'page' is bool"),
    ("c.csv", "text\nx\n", "no column 'page' .*set corpus.group_field"),
])
def test_bad_group_field_is_one_line(tmp_path, name, content, message):
    (tmp_path / name).write_text(content, encoding="utf-8")
    with pytest.raises(RarelmError, match=message):
        list(corpus.iter_grouped(params(tmp_path / name, group_field="page")))


@pytest.mark.parametrize("gz", [False, True])
def test_a_byte_order_mark_at_the_start_of_a_file_is_dropped(tmp_path, gz):
    """Was: kept in the first document of a .txt ('\ufefffirst doc'), and a .jsonl's first line or
    a .csv's first column name (`text_field`) did not parse."""
    bom = "\ufeff"
    suffix = ".gz" if gz else ""
    files = {f"a.txt{suffix}": "first doc\nsecond\n",
             f"b.jsonl{suffix}": '{"body": "first doc"}\n{"body": "second"}\n',
             f"c.csv{suffix}": "body,id\nfirst doc,0\nsecond,1\n"}
    for name, text in files.items():
        data = (bom + text).encode("utf-8")
        (tmp_path / name).write_bytes(gzip.compress(data) if gz else data)
        assert list(corpus.iter_documents(params(tmp_path / name, text_field="body"))) == \
            ["first doc", "second"], name
    (tmp_path / "d.txt").write_text(f"first doc\n{bom}inside\n", encoding="utf-8")  # only at the start
    assert list(corpus.iter_documents(params(tmp_path / "d.txt"))) == ["first doc", f"{bom}inside"]


def test_an_empty_val_or_test_split_is_refused_naming_the_fraction(tmp_path):
    """Was: a corpus whose documents all hash to train went through every stage with exit 0, val
    and test empty, metrics/eval.json all null."""
    from rarelm.params import load_params

    defaults = load_params(REPO / "params.yaml").corpus  # what _prepare_cli runs with
    docs = [f"document number {i}" for i in range(400)]
    to_train = [d for d in docs if corpus.split_of(d, defaults.split_seed, defaults.val_fraction,
                                                    defaults.test_fraction) == "train"][:3]
    path = tmp_path / "c.txt"
    path.write_text("\n".join(to_train) + "\n", encoding="utf-8")
    result = _prepare_cli(tmp_path, path)
    assert result.returncode == 2 and result.stderr.strip() == (
        "rarelm prepare: error: corpus: the val split is empty: none of the 3 documents fell into it "
        f"at corpus.val_fraction = {defaults.val_fraction:g} (corpus.split_seed = {defaults.split_seed}); "
        "raise corpus.val_fraction or give more documents")
    assert not (tmp_path / "prepared").exists() and not (tmp_path / "prepare.json").exists()
    result = _prepare_cli(tmp_path, path, val_fraction=0.0)  # no val split asked for: test's turn
    assert result.returncode == 2 and "the test split is empty: none of the 3 documents" in result.stderr
    result = _prepare_cli(tmp_path, path, val_fraction=0.0, test_fraction=0.0)
    assert result.returncode == 0, result.stderr
    assert list(corpus.read_split(tmp_path / "prepared", "train")) == to_train
