"""How many test terms the train split knows only from the same source document (a man page).

    python bench/split_leak.py RUN [RUN ...] --corpus data/raw/manpages_zh.jsonl.gz --group-field page

A RUN is a folder with the prepare and rare_terms stages' outputs of one configuration
(RUN/prepared/{train,test}.jsonl, RUN/rare/terms.jsonl), e.g. made with `python -m stages.prepare
--params RUN/params.yaml --out RUN/prepared ...` and so on (docs/extraction.md gives the commands).
The corpus file gives each document's group (its `--group-field`); prepared documents are matched
to it by their cleaned text.

For each run it prints the test terms (terms.jsonl terms with an occurrence in the test split, found
as `evaluate` finds them: term_search, jieba word boundaries where terms.jsonl says han_words) and
how many of them occur in train *only in groups that also hold their test occurrences*: sections of
the same man page on both sides of the split, so a page-specific name (`srcCmd`) is "seen in train"
although no other page ever uses it. A split that keeps groups whole has none by construction.
"""

from __future__ import annotations

import argparse
import bisect
import json
from pathlib import Path

from rarelm.params import CorpusParams
from rarelm.prepare.corpus import clean, iter_grouped, read_split
from rarelm.rare_terms.term_search import FoldedText


def groups_by_text(corpus: str, group_field: str) -> dict[str, str]:
    """Cleaned document text -> its group (the first group that has that text)."""
    params = CorpusParams(path=corpus, group_field=group_field, reference_glossary="")
    out: dict[str, str] = {}
    for raw, group in iter_grouped(params):
        out.setdefault(clean(raw), group or "")
    return out


def groups_of_matches(documents: list[str], doc_groups: list[str], rows: list[dict],
                      glossary: tuple[str, ...]) -> list[set[str]]:
    """Per term, the groups of the documents where it occurs."""
    joined = "\n".join(documents)
    starts, pos = [], 0
    for doc in documents:
        starts.append(pos)
        pos += len(doc) + 1
    text = FoldedText(joined)
    found = []
    for row in rows:
        term = row.get("display", row["term"])
        spans = text.find(term, bool(row.get("han_words")), glossary)
        found.append({doc_groups[bisect.bisect_right(starts, i) - 1] for i, _ in spans})
    return found


def leak(run: Path, groups: dict[str, str]) -> dict:
    rows = [json.loads(line) for line in open(run / "rare" / "terms.jsonl", encoding="utf-8")]
    glossary = tuple(r["term"] for r in rows if r["source"] == "glossary")
    per_split = {}
    for split in ("train", "test"):
        docs = list(read_split(run / "prepared", split))
        per_split[split] = groups_of_matches(docs, [groups[d] for d in docs], rows, glossary)
    test_terms = [t for t, g in enumerate(per_split["test"]) if g]
    unseen = [t for t in test_terms if not per_split["train"][t]]
    train, test = per_split["train"], per_split["test"]
    same_page_only = [t for t in test_terms if train[t] and train[t] <= test[t]]
    return {"run": str(run), "terms": len(rows), "test_terms": len(test_terms),
            "test_terms_unseen_in_train": len(unseen),
            "test_terms_in_train_only_in_their_test_groups": len(same_page_only),
            "examples": [rows[t].get("display", rows[t]["term"]) for t in same_page_only[:10]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--corpus", default="data/raw/manpages_zh.jsonl.gz")
    parser.add_argument("--group-field", default="page")
    args = parser.parse_args()
    groups = groups_by_text(args.corpus, args.group_field)
    for run in args.runs:
        print(json.dumps(leak(run, groups), ensure_ascii=False))


if __name__ == "__main__":
    main()
