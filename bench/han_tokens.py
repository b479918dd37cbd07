"""How well tokenizers cover Chinese: tokens per Han character on a corpus.

    python bench/han_tokens.py [--corpus data/raw/manpages_zh.jsonl.gz] [TOKENIZER_FOLDER ...]
    python bench/han_tokens.py smollm2/model base/model        # the default pair

For each tokenizer folder (AutoTokenizer, fast): every maximal run of Han characters in the
corpus (CJK Unified Ideographs U+4E00-U+9FFF and extension A) is encoded on its own, without
special tokens, and the tokens are counted per Han character (1.0: one token each; a byte-level
BPE that has not learned a character spends 2-3 byte tokens on it). Also the share of the
corpus's Han characters (by occurrence) that are one token when encoded alone, and the whole
documents' tokens per character. A byte-level BPE never fails on Chinese, it only spends more
tokens: a 256-token context holds fewer characters, and a term of 4 characters is 4-12 tokens.

    >>> han_runs("ls 列出 directory 目录内容")
    ['列出', '目录内容']

The last line is one JSON object {folder: {"tokens_per_han", "single_token_share",
"tokens_per_char", "han_chars", "documents"}}.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
from pathlib import Path

HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]+")


def han_runs(text: str) -> list[str]:
    return HAN.findall(text)


def documents(path: Path, limit: int) -> list[str]:
    """The corpus's texts: JSON lines with a "text" field, or plain lines."""
    out = []
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            out.append(json.loads(line)["text"] if line.startswith("{") else line)
            if len(out) >= limit:
                break
    return out


def measure(folder: str, texts: list[str]) -> dict:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    runs = [run for text in texts for run in han_runs(text)]
    han_chars = sum(map(len, runs))
    run_tokens = sum(len(ids) for ids in tokenizer(runs, add_special_tokens=False)["input_ids"])
    counts = collections.Counter(char for run in runs for char in run)
    chars = list(counts)
    single = {c for c, ids in zip(chars, tokenizer(chars, add_special_tokens=False)["input_ids"], strict=True)
              if len(ids) == 1}
    doc_tokens = sum(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])
    return {"tokens_per_han": round(run_tokens / han_chars, 3),
            "single_token_share": round(sum(counts[c] for c in single) / han_chars, 4),
            "distinct_han": len(chars), "distinct_single_token": len(single),
            "tokens_per_char": round(doc_tokens / sum(map(len, texts)), 3),
            "han_chars": han_chars, "documents": len(texts), "vocab": len(tokenizer)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*", default=["smollm2/model", "base/model"])
    parser.add_argument("--corpus", type=Path, default=Path("data/raw/manpages_zh.jsonl.gz"))
    parser.add_argument("--limit", type=int, default=1_000_000, help="at most this many documents")
    args = parser.parse_args()
    texts = documents(args.corpus, args.limit)
    results = {}
    for folder in args.folders:
        results[folder] = measure(folder, texts)
        print(f"{folder}: {json.dumps(results[folder])}", flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
