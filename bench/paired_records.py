"""Two recorded runs of a plan, paired occurrence by occurrence: one as the baseline, the other against
it, on all occurrences, first mentions and repeats (the headline compares every configuration with the
plan's first one only; a control is read against the method it controls with this).

    .venv/bin/python -P bench/paired_records.py --out records/realtext/smollm2_retrieval_foldoc_en_val \
        --baseline sr-foldoc_en-retrieval-2x64-random-s1337 --run sr-foldoc_en-retrieval-2x64-s1337 \
        --split val

Prints, per slice and metric, the run's value and its change to the baseline [paired 95% bootstrap
interval over terms] (term perplexity: relative), as `rarelm compare` computes them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rarelm.report.compare import compare, report_row
from rarelm.report.records import load_recorded

METRICS = ("term_ppl", "nll_per_char", "completion_match", "exact_match")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="the plan's --out folder (its runs/ hold the records)")
    ap.add_argument("--baseline", required=True, help="the record to compare against")
    ap.add_argument("--run", required=True, help="the record compared")
    ap.add_argument("--split", default="val")
    args = ap.parse_args()
    out = Path(args.out)
    base, run = (load_recorded(Path("."), out, name, args.split) for name in (args.baseline, args.run))
    report = compare([base], [run])
    label = report["configurations"][-1]["label"]
    print(f"{args.run} against {args.baseline} ({args.split} split)")
    for slice_ in ("all", "first mention", "repeat mention"):
        for metric in METRICS:
            row = report_row(report, label, slice_, metric)
            if row.get("value") is None:
                continue
            scale, unit = (100, "%") if metric == "term_ppl" else (1, "")
            print(f"  {slice_:15s} {metric:17s} n={row['occurrences']:4d}  {row['value']:.4f}  "
                  f"{row['diff'] * scale:+.3f}{unit} [{row['diff_lo'] * scale:+.3f}{unit}, "
                  f"{row['diff_hi'] * scale:+.3f}{unit}]")


if __name__ == "__main__":
    main()
