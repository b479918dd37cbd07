"""The `prepare` stage, start to end: clean the corpus, split it by document, write the splits
and their stats (see stages/prepare.py; the rules are in rarelm/prepare/corpus.py)."""

from __future__ import annotations

from pathlib import Path

from rarelm.files import atomic_dir, outputs_together, write_json
from rarelm.prepare import corpus


def run(params, out: Path, metrics: Path) -> dict:
    """Write out/{train,val,test}.jsonl and out/stats.json, and the same stats to `metrics`;
    returns the stats. `params` is the full Params (it reads `corpus`)."""
    with outputs_together(), atomic_dir(out) as tmp:  # both outputs change, or neither does
        stats = corpus.prepare(params.corpus, tmp)
        write_json(tmp / "stats.json", stats)
        write_json(metrics, stats)
    return stats


def summary(stats: dict) -> str:
    """The stage's one summary line."""
    split = ", ".join(f"{s} {stats[s]['documents']}" for s in corpus.SPLITS)
    return (f"prepare: {stats['documents']} documents ({split}), language {stats['language']}, "
            f"{stats['duplicates']} duplicates and {stats['dropped_short']} short dropped")
