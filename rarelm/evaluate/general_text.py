"""General text held out from the base model's pretraining, scored as the forgetting guard
`ppl_general_model` (the model alone) and as `ppl_general` (what is evaluated, mixing included).

A fine-tune that learns its domain may forget general language; in-domain perplexity cannot show
that. `eval.general_text` names a slice of general text (one document a line, UTF-8) that the base
model never trained on: data/general/en.txt and data/general/zh.txt are the base pipeline's own
held-out documents (base/params.yaml: `corpus.val_fraction` 0.02 of GCIDE and of the Chinese
reviews; see data/general/README.md). `evaluate` scores it teacher-forced, as `ppl` is scored, and
writes `ppl_general_model`, `ppl_general` (the same figure unless kNN-LM or the cache is mixed
in) and `n_general_tokens` into metrics/eval.json. `eval.general_text_outside` names general text
from outside the base's pretraining family (data/general/<language>.outside.txt: Debian's fortune
files, written by rarelm/prepare/corpora.py), scored the same way by the model alone as
`ppl_general_outside` and `n_general_outside_tokens`.

    python -m rarelm.evaluate.general_text build base/data/prepared/val.jsonl base/data/raw data/general

The replay slices (data/general/<language>.replay.txt, `train.replay_text`, rarelm/train/replay.py)
are the opposite: documents of the base's **train** split, which the base model did train on, mixed
into fine-tuning batches; never one of the guard's documents (`build-replay` checks it):

    python -m rarelm.evaluate.general_text build-replay \
        base/data/prepared/train.jsonl base/data/raw data/general

A worked example: documents ["ab", "c"] tokenized as [a, b] and [c] give the stream
a b <eot> c <eot>: four targets (b, <eot>, c, <eot>); with probabilities 1/2, 1/4, 1/2, 1/4 the
general perplexity is exp((ln 2 + ln 4 + ln 2 + ln 4) / 4) = sqrt(8).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import numpy as np

from rarelm.errors import EXIT_USER_ERROR, RarelmError
from rarelm.evaluate.common import EvalContext
from rarelm.files import atomic_file, read_input
from rarelm.prepare.corpus import spread

# the base pipeline's raw corpora whose held-out documents may be committed, by language; People's
# Daily (peoples_daily_zh) is left out: its text is not redistributed (data/raw/corpora.json)
SOURCES = {"en": ("gcide_en",), "zh": ("reviews_zh",)}
# bytes of each replay slice: a few hundred KB, of the order of a small domain corpus, committed in git
REPLAY_BYTES = 300_000


AUTO = "auto"
SLICES = Path("data/general")  # relative to where the stage runs: the repository, for DVC


def resolve(setting: str, language: str, kind: str = "") -> Path | None:
    """The file eval.general_text (kind "") or eval.general_text_outside (kind ".outside") names: a
    path as given; "auto" the project's slice for the corpus' language (data/general/en.txt, zh.txt;
    en.outside.txt, zh.outside.txt) where it exists, else None (a corpus in another language, a
    workspace without the slices); "" None.

    >>> resolve("", "en"), resolve("my/general.txt", "en"), resolve("auto", "xx", ".outside")
    (None, PosixPath('my/general.txt'), None)
    """
    if setting != AUTO:
        return Path(setting) if setting else None
    path = SLICES / f"{language}{kind}.txt"
    return path if path.is_file() else None


def read_documents(path: str | Path, key: str = "eval.general_text") -> list[str]:
    """The slice's documents: its non-empty lines (read with the corpus' guards: `read_input`)."""
    path = Path(path)
    try:
        lines = read_input(key, path).decode("utf-8").splitlines()
    except FileNotFoundError:
        raise RarelmError(f"params: {key} = {str(path)!r}: no such file "
                          "(a UTF-8 text file, one document a line; or \"\" = off)") from None
    except UnicodeDecodeError as exc:
        raise RarelmError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    documents = [line for line in lines if line.strip()]
    if not documents:
        raise RarelmError(f"{path}: no document (every line is empty)")
    return documents


def token_stream(tokenizer, documents: list[str], eot_id: int) -> np.ndarray:
    """The documents' tokens, each followed by the end-of-text token (as the tokenize stage lays
    out a split), as int64."""
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(documents, add_special_tokens=False):
        ids.extend(encoding.ids)
        ids.append(eot_id)
    return np.asarray(ids, dtype=np.int64)


def general_metrics(ctx: EvalContext, path: str | Path, vocab_size: int, block_size: int,
                    key: str = "eval.general_text") -> dict:
    """`ppl_general` (perplexity of every token of the slice after the first, or of the windows
    eval.max_tokens keeps) and `n_general_tokens`; `key`: the param that named the file, for errors."""
    from rarelm.evaluate.token_scoring import score_tokens  # torch: on use

    tokens = token_stream(ctx.tokenizer, read_documents(path, key), ctx.eot_id)
    stats = score_tokens(ctx, tokens, np.zeros(vocab_size, dtype=np.int64), block_size)
    m = stats.metrics()
    return {"ppl_general": m["ppl"], "n_general_tokens": m["n_eval_tokens"]}


def held_out(val_jsonl: Path, raw_dir: Path) -> dict[str, list[str]]:
    """The base pipeline's val documents (never trained on) per language, from the sources of SOURCES,
    in the val split's order."""
    return by_language(val_jsonl, raw_dir)


def by_language(split_jsonl: Path, raw_dir: Path) -> dict[str, list[str]]:
    """A prepared split's documents that come from the sources of SOURCES, per language, in the
    split's order."""
    known = {}
    for language, names in SOURCES.items():
        for name in names:
            with gzip.open(raw_dir / f"{name}.txt.gz", "rt", encoding="utf-8") as f:
                known.update({line.strip(): language for line in f if line.strip()})
    out: dict[str, list[str]] = {language: [] for language in SOURCES}
    with open(split_jsonl, encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["text"]
            if text in known:
                out[known[text]].append(text)
    return out


def build(val_jsonl: Path, raw_dir: Path, out_dir: Path) -> dict[str, int]:
    """Write <out_dir>/<language>.txt (one document a line); returns the documents per language."""
    slices = held_out(val_jsonl, raw_dir)
    for language, documents in slices.items():
        with atomic_file(out_dir / f"{language}.txt") as f:  # never a half-written slice
            f.write("".join(d + "\n" for d in documents))
    return {language: len(documents) for language, documents in slices.items()}


def build_replay(train_jsonl: Path, raw_dir: Path, out_dir: Path, max_bytes: int) -> dict[str, int]:
    """Write <out_dir>/<language>.replay.txt: an even spread (`spread`) of the base's train documents
    from the sources of SOURCES, at most `max_bytes` each. Refused if one of them is in the guard
    slice <out_dir>/<language>.txt, where that exists: replay must never train on the guard."""
    picked = {language: spread(documents, max_bytes)
              for language, documents in by_language(train_jsonl, raw_dir).items()}
    for language, documents in picked.items():
        guard_path = out_dir / f"{language}.txt"
        guard = set(read_documents(guard_path)) if guard_path.is_file() else set()
        shared = [d for d in documents if d in guard]
        if shared:
            raise RarelmError(f"{train_jsonl}: {len(shared)} of its {language} documents are in the "
                              f"guard slice {guard_path} (first: {shared[0][:60]!r}); pass the base's "
                              "train split, not its val split")
    for language, documents in picked.items():
        with atomic_file(out_dir / f"{language}.replay.txt") as f:  # never a half-written slice
            f.write("".join(d + "\n" for d in documents))
    return {language: len(documents) for language, documents in picked.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rarelm.evaluate.general_text",
                                     description="Build the general-text slices from the base's val split.")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="val.jsonl of the base pipeline + its raw corpora -> <out>/<lang>.txt")
    b.add_argument("val_jsonl", type=Path)
    b.add_argument("raw_dir", type=Path)
    b.add_argument("out_dir", type=Path)
    r = sub.add_parser("build-replay", help="train.jsonl of the base pipeline + its raw corpora -> "
                                            "<out>/<lang>.replay.txt")
    r.add_argument("train_jsonl", type=Path)
    r.add_argument("raw_dir", type=Path)
    r.add_argument("out_dir", type=Path)
    r.add_argument("--max-bytes", type=int, default=REPLAY_BYTES, help="per language (default %(default)s)")
    args = parser.parse_args(argv)
    if args.command == "build-replay":
        try:
            counts = build_replay(args.train_jsonl, args.raw_dir, args.out_dir, args.max_bytes)
        except RarelmError as exc:
            print(f"general_text: {exc}", file=sys.stderr)
            return EXIT_USER_ERROR
        for language, n in counts.items():
            print(f"general_text: {language}: {n} replay documents -> "
                  f"{args.out_dir / f'{language}.replay.txt'}")
        return 0
    for language, n in build(args.val_jsonl, args.raw_dir, args.out_dir).items():
        print(f"general_text: {language}: {n} documents -> {args.out_dir / f'{language}.txt'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
