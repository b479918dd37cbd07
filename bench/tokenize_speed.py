"""Benchmark: the `tokenize` stage against plain `Tokenizer.encode_batch`.

    python bench/tokenize_speed.py                  # 20 MB and 200 MB corpora
    python bench/tokenize_speed.py --sizes-mb 5 50  # quicker

For each corpus size it builds a prepared train split from the demo corpus
(documents repeated with a counter so none is a duplicate), then measures, each
in its own process so peak memory (max RSS) is that run's alone:

* `stage`: `rarelm.tokenize.tokenization.tokenize` with a fixed pretrained tokenizer (so
  both sides do the same encoding work): read jsonl, encode in batches, write the
  memory-mapped arrays;
* `raw`: what a user would otherwise write: read every document into a list and
  call `Tokenizer.encode_batch` once.

Each side runs `--repeats` times, alternating, and its best run counts. Prints a
table, then one JSON line with tokens/s, the stage/raw ratio and peak memory per size
(target: ratio >= 0.8; stage peak memory flat as the corpus grows).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import harness

REPO = Path(__file__).resolve().parents[1]


def build_corpus(folder: Path, size_mb: int) -> None:
    """A prepared folder whose train split holds about size_mb of demo text."""
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(REPO / "data/raw/demo_en.txt.gz", "rt", encoding="utf-8") as f:
        docs = [line.rstrip("\n") for line in f]
    written = i = 0
    with open(folder / "train.jsonl", "w", encoding="utf-8") as out:
        while written < size_mb * 1_000_000:
            line = json.dumps({"text": f"Note {i}. {docs[i % len(docs)]}"}) + "\n"
            out.write(line)
            written += len(line)
            i += 1
    for split in ("val", "test"):
        with open(folder / f"{split}.jsonl", "w", encoding="utf-8") as out:
            out.writelines(json.dumps({"text": d}) + "\n" for d in docs[:100])


def worker(mode: str, prepared: Path, tokenizer_dir: Path, out: Path) -> dict:
    """Run one measurement in this process; returns tokens and seconds."""
    import transformers  # noqa: F401  (imported before the clock starts, as on the raw side)

    from rarelm.params import TokenizerParams
    from rarelm.prepare.corpus import read_split
    from rarelm.tokenize.tokenization import tokenize

    if mode == "stage":
        seconds, meta = harness.timed(
            lambda: tokenize(TokenizerParams(name_or_path=str(tokenizer_dir)), prepared, out))
        tokens = sum(s["tokens"] for s in meta["splits"].values())
        return {"tokens": tokens, "seconds": seconds}
    from transformers import AutoTokenizer

    backend = AutoTokenizer.from_pretrained(tokenizer_dir).backend_tokenizer

    def encode_all() -> int:
        tokens = 0
        for split in ("train", "val", "test"):
            texts = list(read_split(prepared, split))
            tokens += sum(len(e.ids) + 1 for e in backend.encode_batch(texts, add_special_tokens=False))
        return tokens

    seconds, tokens = harness.timed(encode_all)
    return {"tokens": tokens, "seconds": seconds}


def measure(mode: str, prepared: Path, tokenizer_dir: Path, out: Path) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    stdout, peak_rss_mb = harness.run_with_peak_rss(
        [sys.executable, __file__, "--worker", mode, str(prepared), str(tokenizer_dir), str(out)],
        f"{mode} worker")
    result = json.loads(stdout.strip().splitlines()[-1])
    return {**result, "tokens_per_s": result["tokens"] / result["seconds"], "peak_rss_mb": peak_rss_mb}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[20, 200])
    parser.add_argument("--repeats", type=int, default=2, help="runs per side; the best counts")
    parser.add_argument("--worker", nargs=4, metavar=("MODE", "PREPARED", "TOKENIZER", "OUT"))
    args = parser.parse_args()
    if args.worker:
        mode, prepared, tokenizer_dir, out = args.worker
        harness.print_json(worker(mode, Path(prepared), Path(tokenizer_dir), Path(out)))
        return

    from rarelm.params import TokenizerParams
    from rarelm.tokenize.tokenization import tokenize

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        build_corpus(tmp / "base", 2)
        (tmp / "base_tok").mkdir()
        tokenize(TokenizerParams(), tmp / "base", tmp / "base_tok")  # the fixed tokenizer of both sides
        tokenizer_dir = tmp / "base_tok" / "tokenizer"
        for size in args.sizes_mb:
            prepared = tmp / f"c{size}"
            build_corpus(prepared, size)
            # alternate the two sides and keep each one's best run: the machine is shared
            runs = [(measure("stage", prepared, tokenizer_dir, tmp / f"out{size}"),
                     measure("raw", prepared, tokenizer_dir, tmp / f"raw{size}"))
                    for _ in range(args.repeats)]
            stage = max((s for s, _ in runs), key=lambda m: m["tokens_per_s"])
            raw = max((r for _, r in runs), key=lambda m: m["tokens_per_s"])
            results[f"{size}MB"] = {
                "tokens": stage["tokens"],
                "stage_tokens_per_s": round(stage["tokens_per_s"]),
                "raw_tokens_per_s": round(raw["tokens_per_s"]),
                "ratio": round(stage["tokens_per_s"] / raw["tokens_per_s"], 3),
                "stage_peak_rss_mb": round(stage["peak_rss_mb"], 1),
                "raw_peak_rss_mb": round(raw["peak_rss_mb"], 1),
            }
            r = results[f"{size}MB"]
            print(f"{size:>5} MB  {r['tokens']:>11,} tokens  stage {r['stage_tokens_per_s']:>9,} tok/s "
                  f"({r['stage_peak_rss_mb']:.0f} MB peak)  raw {r['raw_tokens_per_s']:>9,} tok/s "
                  f"({r['raw_peak_rss_mb']:.0f} MB peak)  ratio {r['ratio']:.2f}", flush=True)
            for folder in (prepared, tmp / f"out{size}"):
                subprocess.run(["rm", "-rf", str(folder)], check=True)
    sizes = list(results)
    growth = results[sizes[-1]]["stage_peak_rss_mb"] / results[sizes[0]]["stage_peak_rss_mb"]
    harness.print_json({"bench": "tokenize", "cpus": os.cpu_count(), "sizes": results,
                        "stage_peak_growth": round(growth, 3),
                        "min_ratio": min(r["ratio"] for r in results.values())})


if __name__ == "__main__":
    main()
