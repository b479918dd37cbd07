"""Benchmark: how clean are the extracted rare terms on real text (docs/extraction.md).

    python bench/extraction_junk.py text SRC... --out DIR   # man pages / HTML / text -> paragraphs
    python bench/extraction_junk.py top DIR --language zh   # the top 100 terms of a text folder
    python bench/extraction_junk.py demo                    # demo F1 (en, zh) and extraction time

`text` turns documentation into one paragraph per line (the `line` documents of
`prepare`): a man page (`*.[1-9]*.gz`, rendered by groff -k -Tutf8 -mandoc, one
very long line per paragraph, without its literal blocks .nf/.fi, .EX/.EE and
tables .TS/.TE), an HTML page (each <p>, <li> and <dd> its text, without <pre>
blocks), or a plain `.txt`/`.txt.gz` (blank-line separated paragraphs): prose,
not code examples, diagrams or tables. Paragraphs under 40 characters
(headings, option names) are dropped.

`top` and `demo` run what the rare_terms stage runs, through the library: the
corpus is prepared (cleaned, deduplicated, split by `corpus.split_seed`) into a
temporary folder, then `rarelm.rare_terms.tfidf.tfidf_terms` runs on the train split with the
`rare` params of params.yaml (`--params`). `top` prints rank, term, count, df and
score; `demo` prints precision, recall and F1 against the demo's reference
glossary, as `metrics["extraction"]` of the stage, and the seconds
`tfidf_terms` took (best of `--repeats`).
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import html.parser
import re
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MIN_PARAGRAPH = 40
DEMO = {"en": ("data/raw/demo_en.txt.gz", "data/raw/demo_en.glossary.tsv"),
        "zh": ("data/raw/demo_zh.txt.gz", "data/raw/demo_zh.glossary.tsv")}


# ---------------------------------------------------------------- documentation -> paragraphs


_LITERAL_BLOCK = re.compile(rb"^\.(nf|EX|TS)\b.*?^\.(fi|EE|TE)\b[^\n]*\n?", re.M | re.S)


def paragraphs_of_man(path: Path) -> list[str]:
    """A man page rendered by groff, one paragraph (blank-line separated block) per item."""
    source = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    source = _LITERAL_BLOCK.sub(b"", source)
    shown = subprocess.run(["groff", "-k", "-Tutf8", "-mandoc", "-rLL=4000n", "-P-cbou"],
                           input=source, capture_output=True).stdout.decode("utf-8", "replace")
    lines = shown.splitlines()[1:-1]  # the page's header and footer lines
    return [" ".join(block.split()) for block in "\n".join(lines).split("\n\n")]


class _BlockText(html.parser.HTMLParser):
    """Text of every <p>, <li> and <dd> of a page (nested blocks end the outer one's text),
    without what <pre> blocks hold."""

    BLOCKS = {"p", "li", "dd"}

    def __init__(self):
        super().__init__()
        self.blocks: list[str] = []
        self._text: list[str] | None = None
        self._in_pre = 0

    def handle_starttag(self, tag, attrs):
        if tag == "pre":
            self._in_pre += 1
        if tag in self.BLOCKS:
            self._flush()
            self._text = []

    def handle_endtag(self, tag):
        if tag == "pre":
            self._in_pre = max(0, self._in_pre - 1)
        if tag in self.BLOCKS:
            self._flush()

    def handle_data(self, data):
        if self._text is not None and not self._in_pre:
            self._text.append(data)

    def _flush(self):
        if self._text:
            self.blocks.append(" ".join("".join(self._text).split()))
        self._text = None


def paragraphs_of_html(path: Path) -> list[str]:
    parser = _BlockText()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    parser.close()
    return parser.blocks


def paragraphs_of_text(path: Path) -> list[str]:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    text = raw.decode("utf-8", "replace")
    return [" ".join(block.split()) for block in re.split(r"\n\s*\n", text)]


def paragraphs_of(path: Path) -> list[str]:
    name = path.name.removesuffix(".gz")
    if name.endswith((".html", ".htm")):
        return paragraphs_of_html(path)
    if name.endswith(".txt"):
        return paragraphs_of_text(path)
    if re.search(r"\.[1-9][a-z]*$", name):
        return paragraphs_of_man(path)
    return []


def make_text(sources: list[Path], out: Path) -> None:
    """Every documentation file under `sources` -> out/<n>.txt, one paragraph per line."""
    out.mkdir(parents=True, exist_ok=True)
    files = sorted(p for s in sources for p in ([s] if s.is_file() else s.rglob("*")) if p.is_file())
    kept = 0
    for i, path in enumerate(files):
        paragraphs = [p for p in paragraphs_of(path) if len(p) >= MIN_PARAGRAPH]
        if paragraphs:
            (out / f"{i:05d}.txt").write_text("\n".join(paragraphs) + "\n", encoding="utf-8")
            kept += len(paragraphs)
    print(f"text: {len(files)} files -> {kept} paragraphs in {out}")


# ---------------------------------------------------------------- extraction through the library


def prepared_documents(corpus_path: Path, language: str, params) -> list[str]:
    """The train documents the rare_terms stage would see for this corpus."""
    from rarelm.prepare import corpus
    from rarelm.rare_terms.stage import training_documents

    corpus_params = dataclasses.replace(params.corpus, path=str(corpus_path), format="txt",
                                        language=language, txt_documents="line")
    with tempfile.TemporaryDirectory(prefix="extraction_junk_") as tmp:
        stats = corpus.prepare(corpus_params, Path(tmp))
        return training_documents(Path(tmp), stats["train"]["documents"],
                                       params.rare.max_documents)


def extract(documents: list[str], language: str, params, glossary=()):
    """(terms, seconds): tfidf.tfidf_terms with the `rare` params."""
    from rarelm.rare_terms.segmentation import Segmenter
    from rarelm.rare_terms.tfidf import tfidf_terms

    p = params.rare
    started = time.perf_counter()
    terms = tfidf_terms(documents, Segmenter(language, glossary), p.ngram_max, p.min_df,
                             p.max_df, p.min_count, p.min_mean_tf, p.top_k)
    return terms, time.perf_counter() - started


def show_top(folder: Path, language: str, params, n: int) -> None:
    documents = prepared_documents(folder, language, params)
    terms, seconds = extract(documents, language, params)
    print(f"# {folder}: {len(documents)} train documents, {len(terms)} terms, {seconds:.1f} s")
    for rank, t in enumerate(terms[:n], 1):
        print(f"{rank}\t{t.term}\t{t.count}\t{t.df}\t{t.score:.2f}")


def show_demo(params, repeats: int) -> None:
    from rarelm.rare_terms.glossary import extraction_scores, read_reference

    for language, (corpus_path, reference_path) in DEMO.items():
        documents = prepared_documents(REPO / corpus_path, language, params)
        reference = read_reference(REPO / reference_path)
        extract(documents[:50], language, params)  # imports, stop words, jieba's dictionary
        runs = [extract(documents, language, params) for _ in range(repeats)]
        s = extraction_scores([t.term for t in runs[0][0]], reference)
        print(f"demo {language}: {len(documents)} documents, {s['extracted']} terms, "
              f"P {s['precision']:.4f} R {s['recall']:.4f} F1 {s['f1']:.5f}, "
              f"tfidf_terms {min(sec for _, sec in runs):.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=Path, default=REPO / "params.yaml")
    sub = parser.add_subparsers(dest="command", required=True)
    text = sub.add_parser("text", help="documentation files -> one paragraph per line")
    text.add_argument("sources", type=Path, nargs="+")
    text.add_argument("--out", type=Path, required=True)
    top = sub.add_parser("top", help="the top terms of a folder of .txt files (one document a line)")
    top.add_argument("folder", type=Path)
    top.add_argument("--language", choices=["en", "zh"], required=True)
    top.add_argument("--n", type=int, default=100)
    demo = sub.add_parser("demo", help="demo extraction F1 and time, English and Chinese")
    demo.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.command == "text":
        return make_text(args.sources, args.out)
    from rarelm.params import load_params

    params = load_params(args.params)
    if args.command == "top":
        show_top(args.folder, args.language, params, args.n)
    else:
        show_demo(params, args.repeats)


if __name__ == "__main__":
    main()
