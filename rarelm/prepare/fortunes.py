"""Fortune cookie files (Debian's fortune-mod and fortunes-zh) as general text from outside the base
model's pretraining family: the entries of a file and which of them are kept. The corpora
`fortunes_en` and `fortunes_zh` of data/raw/corpora.json (rarelm.prepare.corpora reads the package
archives and writes data/general/<language>.outside.txt; data/general/README.md).

A fortune file holds entries between lines that hold only `%`; fortunes-zh colours its titles and
attributions with ANSI escapes, which go. An entry's attribution line ("-- Mark Twain", "作者：杜甫")
stays: it is part of the text, for every entry alike.

    >>> entries("one\\n  -- A\\n%\\n\\x1b[32m《二》\\x1b[m\\n%\\n%\\n")
    ['one\\n  -- A\\n', '《二》\\n']
    >>> one_line_zh("床前明月光，\\n疑是地上霜。\\n  -- 李白")
    '床前明月光，疑是地上霜。--李白'
"""

from __future__ import annotations

import re

FOLDER = "usr/share/games/fortunes/"
ZH_FILES = ("chinese", "song100", "tang300")  # every file of fortunes-zh, in name order
# fortune-mod's files left out: computing (the domain corpus foldoc_en is computing: in each of these a
# tenth or more of the entries name a computing word, and debian, knghtbrd, linux* and perl are about
# Debian, Linux or Perl) and no English prose (ascii-art's pictures, translate-me's requests)
EN_LEFT_OUT = ("ascii-art", "computers", "cookie", "debian", "definitions", "goedel", "knghtbrd", "linux",
               "linuxcookie", "perl", "songs-poems", "translate-me")
ZH_MIN_HAN_SHARE = 0.9  # below: mostly Latin letters (commands, tables, chat logs) or none (emoticons)

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SEPARATOR = re.compile(r"^%\n", re.MULTILINE)
# about computing or Debian: the Debian reference card and manual, its code of conduct, Stallman's and
# Raymond's sayings, mathematics from Wikipedia (http), a graphics-card forum (显卡)
_COMPUTING_ZH = re.compile(r"Debian|Linux|Unix|UNIX|GNU|RMS|http|软件|程序|计算机|编程|代码|"
                           r"操作系统|互联网|数据|算法|显卡")
_KANA = re.compile(r"[\u3040-\u30fa]")  # Japanese (U+30FB, the middle dot of poem titles, is not kana)
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
# traditional-only forms of common characters: two in one entry mark traditional script (the
# Shijing's 305 poems, titled 《詩經‧ ...》); simplified text seldom has one
TRADITIONAL = frozenset("們這個為來說時國會對於學與過還後點樣經現開問關讓麼產無見長電書東車門馬鳥魚龍風飛"
                        "葉樂聲萬雲華歸兒誰從錢語話記讀寫詩詞論陳張劉陽陰應該當發變體實權眾幾齊歲歷壽亂亞"
                        "嗎爾聽臺灣綠黃憂爭戰蘭蕭寶貝負貴買賣頭顏題願類親覺觀計認誠請諸謂識軍輕農遠進選邊"
                        "鄉醫鐵閒間陸隨雖雞離難靜韓順須領養餘驚鬥麥黨齒")
_SPACE = re.compile(r"\s+")
_SPACE_BY_CJK = re.compile(r" (?=[^\x00-\x7f])|(?<=[^\x00-\x7f]) ")


def entries(text: str) -> list[str]:
    """A fortune file's entries, colour escapes removed, empty ones left out."""
    return [e for e in (_ANSI.sub("", part) for part in _SEPARATOR.split(text)) if e.strip()]


def english_file(member: str) -> bool:
    """A fortune-mod file (a member path) whose entries are kept: under FOLDER, a name without a dot
    (not the .dat indexes), not one of EN_LEFT_OUT.

    >>> [english_file(FOLDER + n) for n in ("wisdom", "wisdom.dat", "computers")]
    [True, False, False]
    """
    name = member.removeprefix(FOLDER)
    return member.startswith(FOLDER) and bool(re.fullmatch(r"[a-z-]+", name)) and name not in EN_LEFT_OUT


def general_zh(entry: str, han_share: float) -> bool:
    """A fortunes-zh entry kept as general Chinese (`han_share`: its Han share among letters,
    rarelm.prepare.corpora.han_share): not about computing or Debian, Han share >= ZH_MIN_HAN_SHARE,
    no kana, fewer than two TRADITIONAL characters.

    >>> general_zh("学而时习之", 1.0), general_zh("Debian 参考卡片", 0.5), general_zh("《詩經》", 1.0)
    (True, False, False)
    """
    traditional = sum(ch in TRADITIONAL for ch in _HAN.findall(entry))
    return (han_share >= ZH_MIN_HAN_SHARE and traditional < 2
            and not _COMPUTING_ZH.search(entry) and not _KANA.search(entry))


def one_line_zh(entry: str) -> str:
    """A Chinese entry on one line: whitespace collapsed, and no space beside a non-ASCII character
    (the line breaks of a poem join its lines as the base's Chinese text is written, without one)."""
    return _SPACE_BY_CJK.sub("", _SPACE.sub(" ", entry).strip())
