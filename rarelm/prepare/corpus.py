"""Reading, cleaning and splitting a raw corpus (the `prepare` stage).

Documents stream from a file or a folder of files, one at a time, so memory
is bounded by the longest line, not the corpus: a line (and a document) longer
than `corpus.max_line_bytes` is refused before it is read whole. De-duplication
alone grows with the corpus, by an 8-byte digest per unique document in a flat
table (`SeenDigests`, 12-24 bytes each):

    >>> clean("  Myocardial\\x1b[31m  infarction\\x07 ")
    'Myocardial infarction'
    >>> [split_of(doc, seed=0, val_fraction=0.1, test_fraction=0.1) for doc in "abcdef"]
    ['test', 'train', 'test', 'test', 'train', 'train']

A document's split is a function of its own text and the seed alone, so adding
documents to a corpus never moves the others to another split. A corpus whose
documents come in groups (the sections of one man page, the chapters of a book, the
notes of one patient) names the group's field (`corpus.group_field`, in a jsonl, csv
or parquet corpus): the split is then a function of the group and the seed, so a
group is never split across train, val and test, and a page's own names cannot leak
from train into test. A document with no group (null or "") is a group of its own.
"""

from __future__ import annotations

import array
import codecs
import csv
import gzip
import hashlib
import json
import re
import sys
import unicodedata
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from rarelm.errors import RarelmError
from rarelm.files import inside, kind_of, warn_if_outside
from rarelm.params import CorpusParams

FORMATS = ("txt", "jsonl", "csv", "parquet")
SPLITS = ("train", "val", "test")

_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
# Unicode category Cc is exactly U+0000-001F and U+007F-009F; whitespace among them stays
_CONTROL = dict.fromkeys(c for c in [*range(0x20), *range(0x7F, 0xA0)] if chr(c) not in "\t\n\r")
_SPACE = re.compile(r"\s+")


def clean(text: str, form: str = "NFC") -> str:
    """Normalise Unicode, drop ANSI escapes and control characters, collapse whitespace."""
    text = unicodedata.normalize(form, text)
    text = _ANSI.sub("", text)
    text = text.translate(_CONTROL)
    return _SPACE.sub(" ", text).strip()


def split_of(text: str, seed: int, val_fraction: float, test_fraction: float) -> str:
    """The split of a document, from a stable hash of (seed, text)."""
    digest = hashlib.blake2b(f"{seed}\0{text}".encode(), digest_size=8).digest()
    u = int.from_bytes(digest, "big") / 2**64
    if u < test_fraction:
        return "test"
    if u < test_fraction + val_fraction:
        return "val"
    return "train"


def format_of(path: Path, fmt: str = "auto") -> str:
    """The format of a corpus file: `fmt`, or guessed from its suffixes (.gz ignored)."""
    if fmt != "auto":
        return fmt
    suffixes = [s.lower() for s in path.suffixes if s.lower() != ".gz"]
    suffix = suffixes[-1].lstrip(".") if suffixes else ""
    if suffix in ("txt", "text"):
        return "txt"
    if suffix in ("jsonl", "ndjson"):
        return "jsonl"
    if suffix in ("csv", "parquet"):
        return suffix
    raise RarelmError(
        f"corpus.path: unsupported format {path.name!r} "
        f"(supported: .txt, .jsonl, .csv, .parquet, optionally .gz; or set corpus.format)")


def corpus_files(params: CorpusParams) -> list[Path]:
    """The corpus file, or the supported files of the corpus folder in sorted order.

    In a folder, a symbolic link whose target lies outside both the folder and the repository
    (where DVC's cache is: rarelm.files `repository_roots`) is skipped with a warning: a corpus from
    elsewhere must not pull in /etc/passwd or ~/.ssh by a link. A corpus.path that itself lies
    outside the repository (an absolute path, `..`, a link) is read, with one warning line.
    """
    root = Path(params.path)
    if not params.path:
        raise RarelmError("corpus.path is empty: set it to a corpus file or folder")
    if not root.exists():
        raise RarelmError(f"corpus.path: no such file or folder: {root}")
    if root.is_file():
        format_of(root, params.format)
        warn_if_outside("corpus.path", root)
        return [root]
    if not root.is_dir():  # a named pipe would block the read, or be called an empty folder
        raise RarelmError(f"corpus.path: {root} is a {kind_of(root.stat().st_mode)}, not a file or "
                          "folder; point it at the corpus file (a .gz for a compressed one)")
    warn_if_outside("corpus.path", root)
    files = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")):
        try:
            format_of(path, params.format)
        except RarelmError:
            continue
        if not inside(path.resolve(), root.resolve()):
            print(f"rarelm prepare: warning: skipping {path}: a link to {path.resolve()}, outside "
                  f"the corpus folder and the repository", file=sys.stderr, flush=True)
            continue
        files.append(path)
    if not files:
        raise RarelmError(f"corpus.path: folder {root} holds no .txt, .jsonl, .csv or .parquet file")
    return files


def _open_binary(path: Path) -> IO[bytes]:
    with open(path, "rb") as probe:
        gzipped = probe.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rb") if gzipped else open(path, "rb")


def _raw_lines(path: Path, max_bytes: int) -> Iterator[bytes]:
    """Lines of a file as bytes, gunzipped if it is gzip, each read with a buffer of at most
    `max_bytes` + 1 bytes: a longer line (a gzip bomb of one line, a file without newlines) is a
    RarelmError before it fills memory. So is a truncated or corrupt gzip stream (found only
    while reading: `EOFError`, `BadGzipFile`, `zlib.error`)."""
    with _open_binary(path) as f:
        lines = 0
        try:
            while raw := f.readline(max_bytes + 1):
                if len(raw) > max_bytes and not raw.endswith(b"\n"):
                    raise RarelmError(
                        f"{path}: line {lines + 1} is longer than corpus.max_line_bytes = {max_bytes} "
                        "bytes; split it into documents or raise the limit")
                yield raw
                lines += 1
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            what = "truncated" if isinstance(exc, EOFError) else "corrupt"
            raise RarelmError(f"{path}: {what} gzip file after {lines} lines ({exc}); "
                              "re-create or re-download it") from None


def _decoded_lines(path: Path, errors: str, max_bytes: int) -> Iterator[str]:
    """Lines of a (possibly gzipped) UTF-8 file, without the byte order mark that some editors put
    at its start (it was kept in the first document; it broke a .jsonl's first line and a .csv's
    first column name); invalid bytes raise with their place."""
    offset = 0
    for number, raw in enumerate(_raw_lines(path, max_bytes), start=1):
        if number == 1 and raw.startswith(codecs.BOM_UTF8):
            raw, offset = raw[len(codecs.BOM_UTF8):], len(codecs.BOM_UTF8)
        try:
            yield raw.decode("utf-8", errors=errors)
        except UnicodeDecodeError as exc:
            raise RarelmError(
                f"{path}: line {number} (byte {offset + exc.start}) is not valid UTF-8: "
                f"{raw[exc.start:exc.end]!r}; fix the file or set corpus.encoding_errors: replace"
            ) from None
        offset += len(raw)


def _iter_txt(path: Path, params: CorpusParams) -> Iterator[tuple[str, None]]:
    lines = _decoded_lines(path, params.encoding_errors, params.max_line_bytes)
    if params.txt_documents == "line":
        for line in lines:
            yield line.rstrip("\r\n"), None
        return
    paragraph: list[str] = []
    size = 0
    for number, line in enumerate(lines, start=1):
        if line.strip():
            paragraph.append(line)
            size += len(line)
            if size > params.max_line_bytes:  # characters: a lower bound of the bytes
                raise RarelmError(
                    f"{path}: the document at line {number} is longer than "
                    f"corpus.max_line_bytes = {params.max_line_bytes} bytes; split it or raise the limit")
        elif paragraph:
            yield "".join(paragraph), None
            paragraph, size = [], 0
    if paragraph:
        yield "".join(paragraph), None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _field(record: object, path: Path, where: str, field: str, errors: str) -> str:
    """The text field of a JSON record: a string, or null for none. Anything else (a number, a
    list, an object) is refused rather than written as Python's repr of it; a lone surrogate
    escape (`"\\ud800"`, not a character) is replaced by U+FFFD under encoding_errors: replace."""
    if not isinstance(record, dict) or field not in record:
        raise RarelmError(f"{path}: {where} has no field {field!r} (set corpus.text_field)")
    value = record[field]
    if value is None:
        return ""
    if not isinstance(value, str):
        kind = {bool: "a boolean", int: "a number", float: "a number", list: "a list",
                dict: "an object"}.get(type(value), type(value).__name__)
        raise RarelmError(f"{path}: {where}: field {field!r} is {kind}, not a string")
    if _SURROGATE.search(value):
        if errors != "replace":
            raise RarelmError(
                f"{path}: {where}: field {field!r} holds a lone surrogate escape "
                f"({_SURROGATE.search(value).group().encode('unicode_escape').decode()}), which is "
                "no character; fix the file or set corpus.encoding_errors: replace")
        value = _SURROGATE.sub("\ufffd", value)
    return value


def _iter_jsonl(path: Path, params: CorpusParams) -> Iterator[tuple[str, str | None]]:
    lines = _decoded_lines(path, params.encoding_errors, params.max_line_bytes)
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RarelmError(f"{path}: line {number} is not valid JSON: {exc.msg}") from None
        except RecursionError:  # [[[[...]]]] 100,000 deep: Python's reader recurses per level
            raise RarelmError(f"{path}: line {number} is JSON nested deeper than can be read (more than "
                              f"about {sys.getrecursionlimit()} levels); a line is one object with the "
                              f"text in {params.text_field!r}") from None
        text = _field(record, path, f"line {number}", params.text_field, params.encoding_errors)
        group = None
        if params.group_field:
            if params.group_field not in record:
                raise RarelmError(f"{path}: line {number} has no field {params.group_field!r} "
                                  "(set corpus.group_field)")
            group = _group_value(record[params.group_field], path, f"line {number}", params.group_field)
        yield text, group


def _iter_csv(path: Path, params: CorpusParams) -> Iterator[tuple[str, str | None]]:
    """Rows of a CSV file, read strictly: a quote left open (`"unclosed doc,2`) is refused with the
    line where its record starts, where the lenient reader ran the field on through the next
    lines (149 rows became one document of 163,907 characters, silently)."""
    csv.field_size_limit(params.max_line_bytes)  # a quoted field may span lines
    reader = csv.DictReader(_decoded_lines(path, params.encoding_errors, params.max_line_bytes), strict=True)
    ended = 1  # the line the last whole record ended on (the header's, first)
    try:
        if reader.fieldnames is None:
            return
        for field, key in ((params.text_field, "text_field"), (params.group_field, "group_field")):
            if field and field not in reader.fieldnames:
                raise RarelmError(
                    f"{path}: no column {field!r} (columns: {', '.join(reader.fieldnames)}; "
                    f"set corpus.{key})")
        for row in reader:
            ended = reader.line_num
            group = (row[params.group_field] or None) if params.group_field else None
            yield row[params.text_field] or "", group
    except csv.Error as exc:
        if "field larger than field limit" in str(exc):
            raise RarelmError(f"{path}: line {reader.line_num}: {exc} (corpus.max_line_bytes = "
                              f"{params.max_line_bytes})") from None
        raise RarelmError(f"{path}: line {ended + 1}: a quoted field is not closed where it should be "
                          f"({exc}), so its record would run on through the lines after it; close the quote, "
                          'or double a quote inside a quoted field ("")') from None


def _iter_parquet(path: Path, params: CorpusParams) -> Iterator[tuple[str, str | None]]:
    import pyarrow as pa  # here: ~0.5 s to import, and only parquet corpora need it
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for a file that is not parquet
        raise RarelmError(f"{path}: not a readable parquet file ({exc})") from None
    columns = [params.text_field] + ([params.group_field] if params.group_field else [])
    for field, key in zip(columns, ("text_field", "group_field")[:len(columns)], strict=True):
        if field not in table.schema_arrow.names:
            raise RarelmError(
                f"{path}: no column {field!r} (columns: "
                f"{', '.join(table.schema_arrow.names)}; set corpus.{key})")
    batches = table.iter_batches(batch_size=4096, columns=columns)
    while True:
        try:  # a corrupt or truncated page shows only when its batch is read
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as exc:
            raise RarelmError(f"{path}: corrupt parquet data ({exc})") from None
        if batch is None:
            return
        groups = batch.column(1).to_pylist() if params.group_field else [None] * batch.num_rows
        for value, group in zip(batch.column(0).to_pylist(), groups, strict=True):
            if value is not None and not isinstance(value, str):
                raise RarelmError(f"{path}: column {params.text_field!r} holds "
                                  f"{type(value).__name__} values, not text")
            yield value or "", _group_value(group, path, "a row", params.group_field)


_READERS = {"txt": _iter_txt, "jsonl": _iter_jsonl, "csv": _iter_csv, "parquet": _iter_parquet}


def iter_grouped(params: CorpusParams) -> Iterator[tuple[str, str | None]]:
    """(raw document, its group or None), file after file, in a stable order; the group is
    `corpus.group_field`'s value (None without one: every document its own group)."""
    for path in corpus_files(params):
        fmt = format_of(path, params.format)
        if params.group_field and fmt == "txt":
            raise RarelmError(f"corpus.group_field: {path} is plain text, which has no fields; "
                              "give a jsonl, csv or parquet corpus a group column, or set it to \"\"")
        yield from _READERS[fmt](path, params)


def iter_documents(params: CorpusParams) -> Iterator[str]:
    """Raw documents of the corpus, file after file, in a stable order."""
    for text, _ in iter_grouped(params):
        yield text


def _group_value(value: object, path: Path, where: str, field: str) -> str | None:
    """A group name: a string or an integer (an id); null or "" is no group."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise RarelmError(f"{path}: {where}: group field {field!r} is {type(value).__name__}, "
                      "not a string or an integer")


def detect_language(texts: Iterable[str]) -> str:
    """`zh` if at least a fifth of the letters are CJK ideographs, else `en`."""
    cjk = letters = 0
    for text in texts:
        for ch in text:
            if ch.isalpha():
                letters += 1
                cjk += "\u4e00" <= ch <= "\u9fff" or "\u3400" <= ch <= "\u4dbf"
    return "zh" if letters and cjk / letters >= 0.2 else "en"


class SeenDigests:
    """A set of 8-byte digests (of documents) in one flat table of unsigned 64-bit slots (open
    addressing with linear probing; 0 marks an empty slot), at most two thirds full and doubled
    when it would be fuller: 12 to 24 bytes per member (36 while it grows), where a Python set
    of digests took ~100.

    Two different documents share a digest with probability about n^2 / 2^65 over n unique
    documents (birthday bound): 3e-8 for a million, 3e-4 for 100 million; the later one
    would then be dropped as a duplicate.

    >>> seen = SeenDigests(capacity=4)
    >>> [seen.add(d) for d in (b"aaaaaaaa", b"bbbbbbbb", b"cccccccc", b"aaaaaaaa", b"cccccccc")]
    [True, True, True, False, False]
    >>> len(seen), len(seen.slots)
    (3, 8)
    """

    def __init__(self, capacity: int = 1 << 16):  # a power of two
        self.slots = array.array("Q", bytes(8 * capacity))
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def add(self, digest: bytes) -> bool:
        """Add `digest`; False if it was already there."""
        value = int.from_bytes(digest, "little") or 1  # 0 is the empty slot
        if not self._insert(self.slots, value):
            return False
        self.size += 1
        if 3 * self.size > 2 * len(self.slots):
            self._grow()
        return True

    @staticmethod
    def _insert(slots: array.array, value: int) -> bool:
        mask = len(slots) - 1
        at = value & mask  # the digest's low bits are as uniform as any
        while (slot := slots[at]) != 0:
            if slot == value:
                return False
            at = (at + 1) & mask
        slots[at] = value
        return True

    def _grow(self) -> None:
        bigger = array.array("Q", bytes(16 * len(self.slots)))
        for value in self.slots:
            if value:
                self._insert(bigger, value)
        self.slots = bigger


def prepare(params: CorpusParams, out_dir: Path) -> dict:
    """Clean and split the corpus into out_dir/{train,val,test}.jsonl; returns stats.

    Each output line is `{"text": ...}`. Raises RarelmError if nothing is left.
    """
    stats = {s: {"documents": 0, "characters": 0} for s in SPLITS}
    dropped_short = duplicates = 0
    seen = SeenDigests()
    groups = {s: SeenDigests() for s in SPLITS}  # distinct groups per split (group_field only)
    sample: list[str] = []
    files = {s: open(out_dir / f"{s}.jsonl", "w", encoding="utf-8", newline="\n") for s in SPLITS}
    try:
        for raw, group in iter_grouped(params):
            text = clean(raw)
            if len(text) < params.min_chars:
                dropped_short += 1
                continue
            if params.dedup and not seen.add(hashlib.blake2b(text.encode(), digest_size=8).digest()):
                duplicates += 1
                continue
            # a group's documents share the split of its name; without one, a document's own text
            key = text if group is None else group
            split = split_of(key, params.split_seed, params.val_fraction, params.test_fraction)
            if params.group_field:
                groups[split].add(hashlib.blake2b(f"{group is None}\0{key}".encode(), digest_size=8).digest())
            files[split].write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
            stats[split]["documents"] += 1
            stats[split]["characters"] += len(text)
            if len(sample) < 200:
                sample.append(text)
    finally:
        for f in files.values():
            f.close()
    total = sum(s["documents"] for s in stats.values())
    if total == 0:
        raise RarelmError(f"corpus.path: {params.path} holds no document after cleaning")
    if stats["train"]["documents"] == 0:
        raise RarelmError(f"corpus.path: {params.path} left no document for the train split")
    _check_held_out(params, stats, total)
    language = params.language if params.language != "auto" else detect_language(sample)
    if params.group_field:  # documents without a group count as groups of their own
        for s in SPLITS:
            stats[s]["groups"] = len(groups[s])
    return {**stats, "documents": total, "dropped_short": dropped_short,
            "duplicates": duplicates, "language": language}


def _check_held_out(params: CorpusParams, stats: dict, total: int) -> None:
    """Refuse a val or test split that its fraction asks for but no document fell into (every
    later stage went on: early stopping and the test metrics all null)."""
    for split in ("val", "test"):
        fraction = getattr(params, f"{split}_fraction")
        if fraction > 0 and stats[split]["documents"] == 0:
            by = f" (split by their {params.group_field!r} groups)" if params.group_field else ""
            raise RarelmError(
                f"corpus: the {split} split is empty: none of the {total} documents{by} fell into it "
                f"at corpus.{split}_fraction = {fraction:g} (corpus.split_seed = {params.split_seed}); "
                f"raise corpus.{split}_fraction or give more documents")


def read_split(prepared_dir: str | Path, split: str) -> Iterator[str]:
    """The documents of one prepared split, streamed."""
    with open(Path(prepared_dir) / f"{split}.jsonl", encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]


def spread(documents: list[str], max_bytes: int) -> list[str]:
    """Every k-th document from the first, k the smallest stride whose pick fits `max_bytes` of UTF-8
    (one newline per document counted): an even spread over the split, the same every time.

    >>> spread(["aa", "bb", "cc", "dd", "ee"], 7)   # 15 bytes in all: k = 3 gives "aa", "dd"
    ['aa', 'dd']
    """
    stride = spread_stride(documents, max_bytes)
    return documents[::stride] if stride else []


def spread_stride(documents: list[str], max_bytes: int) -> int | None:
    """The k of `spread` (None: no document, or none fits)."""
    sizes = [len(d.encode("utf-8")) + 1 for d in documents]
    return next((k for k in range(1, len(documents) + 1) if sum(sizes[::k]) <= max_bytes), None)
