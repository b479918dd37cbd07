"""The markdown views of a comparison report: the difference table and the run-level table.

    >>> over({"slice": "all", "aggregate": "terms"})
    'all, per term'
"""

from __future__ import annotations

from rarelm.fmt import four_decimals, p_value
from rarelm.report.occurrences import LOW_COUNT, MAIN_SLICES


def over(row: dict) -> str:
    return row["slice"] + (", per term" if row["aggregate"] == "terms" else "")


def main_rows(report: dict) -> list[dict]:
    """The rows that the markdown table shows: main slices; per term only for all and train_count<=15."""
    per_term = {"all", f"train_count<={LOW_COUNT}"}
    rows = [r for r in report["rows"] if r["slice"] in MAIN_SLICES
            and (r["aggregate"] == "occurrences" or r["slice"] in per_term)]
    order = {name: i for i, name in enumerate(MAIN_SLICES)}
    labels = {c["label"]: i for i, c in enumerate(report["configurations"])}
    metrics = {m: i for i, m in enumerate(report["metrics"])}
    return sorted(rows, key=lambda r: (metrics[r["metric"]], order[r["slice"]],
                                       r["aggregate"] == "terms", labels[r["configuration"]]))


def ci(row: dict, prefix: str = "diff") -> str:
    """The row's 95% interval; a relative difference (term perplexity: compare.exp_row) in percent.

    >>> row = {"diff_lo": -0.5, "diff_hi": 0.25}
    >>> ci({**row, "diff_is_relative": True}), ci(row)
    ('[-50.0%, +25.0%]', '[-0.5000, +0.2500]')
    """
    if row.get(f"{prefix}_lo") is None:
        return ""
    if prefix != "value" and row.get("diff_is_relative") is True:
        return f"[{row[f'{prefix}_lo']:+.1%}, {row[f'{prefix}_hi']:+.1%}]"
    signed = prefix != "value"
    return f"[{four_decimals(row[f'{prefix}_lo'], signed)}, {four_decimals(row[f'{prefix}_hi'], signed)}]"


def diff_cell(row: dict) -> str:
    """The difference to the baseline: relative (in percent) where the row says so."""
    if row.get("diff") is None:
        return ""
    return f"{row['diff']:+.1%}" if row.get("diff_is_relative") is True else four_decimals(row["diff"], True)


def rests_on(report: dict) -> str:
    b = report["bootstrap"]
    lower = ", ".join(report["lower_is_better"])
    return (f"{report['occurrences']} term occurrences of {report['terms']} terms (split "
            f"{', '.join(report['splits'])}), paired across runs. 95% CI: bootstrap over terms and seeds "
            f"together ({b['resamples']} resamples, seed {b['seed']}): each row's interval rests on its "
            f"seeds (the baseline's: {len(report['configurations'][0]['runs'])}) and terms. p: exact sign "
            f"test over terms. Lower is better: {lower or 'none of these'}.")


def run_table(report: dict) -> list[list[str]]:
    """Rows of the run-level table: eval.json figures with intervals over seeds."""
    return [[r["configuration"], str(r["seeds"]), r["metric"], f"{r['value']:.4g}", ci(r, "value"),
             four_decimals(r.get("diff"), True) if "diff" in r else "", ci(r),
             f"{r['relative']:+.1%}" if r.get("relative") is not None else ""]
            for r in report.get("run_rows", [])]


def band_table(report: dict, metric: str = "nll_per_char") -> list[str]:
    """Markdown lines: `metric` of the baseline and each configuration's difference [95% CI] per
    train-count band of the terms (over occurrences), bands in train-count order; none without bands.

    >>> row = {"metric": "nll_per_char", "aggregate": "occurrences", "occurrences": 4, "terms": 2}
    >>> report = {"configurations": [{"label": "base"}, {"label": "x"}], "rows": [
    ...     {**row, "configuration": "base", "slice": "band 2-3", "value": 2.5},
    ...     {**row, "configuration": "x", "slice": "band 2-3", "value": 2.4, "diff": -0.1,
    ...      "diff_lo": -0.2, "diff_hi": -0.05}]}
    >>> print("\\n".join(band_table(report)[2:]))
    | terms seen in train (occurrences, terms) | base | x: diff [95% CI] |
    | --- | ---: | --- |
    | 2-3 (4, 2) | 2.5000 | -0.1000 [-0.2000, -0.0500] (-4.0%) |
    """
    rows = [r for r in report["rows"] if r["metric"] == metric and r["aggregate"] == "occurrences"
            and r["slice"].startswith("band ")]
    if not rows:
        return []
    labels = [c["label"] for c in report["configurations"]]
    bands = list(dict.fromkeys(r["slice"] for r in rows))  # compare's order: by train count
    cell = {(r["configuration"], r["slice"]): r for r in rows}
    lines = ["", f"{metric} by how often the train split holds the term (occurrences):", "",
             f"| terms seen in train (occurrences, terms) | {labels[0]} | "
             + " | ".join(f"{c}: diff [95% CI]" for c in labels[1:]) + " |",
             "| --- | ---: |" + " --- |" * (len(labels) - 1)]
    for band in bands:
        base = cell[(labels[0], band)]
        diffs = [cell.get((c, band), {}) for c in labels[1:]]
        shown = [f"{four_decimals(d['diff'], True)} {ci(d)} ({d['diff'] / base['value']:+.1%})"
                 if d.get("diff") is not None else "" for d in diffs]
        lines.append(f"| {band[5:]} ({base['occurrences']}, {base['terms']}) | "
                     f"{four_decimals(base['value'])} | " + " | ".join(shown) + " |")
    return lines


RUN_HEADER = ["configuration", "seeds", "metric", "mean", "95% CI", "diff vs baseline", "95% CI", "relative"]


def markdown(report: dict) -> str:
    """The difference table, the run-level table and which runs make each configuration, as markdown."""
    lines = ["# rarelm compare", ""]
    for c in report["configurations"]:
        runs = ", ".join(f"{r['name']} (seed {r['seed']})" for r in c["runs"])
        lines.append(f"- **{c['label']}**: {runs}")
    lines += ["", rests_on(report), ""]
    if report["left_out"]:
        lines += [f"Left out (not in every run): {', '.join(report['left_out'])}.", ""]
    lines += ["| configuration | seeds | terms | metric | over | value | diff vs baseline | 95% CI | p |",
              "| --- | ---: | ---: | --- | --- | ---: | ---: | --- | ---: |"]
    for r in main_rows(report):
        diff = diff_cell(r) if "diff" in r else ""
        lines.append(f"| {r['configuration']} | {r['seeds']} | {r['terms']} | {r['metric']} | {over(r)} | "
                     f"{four_decimals(r['value'])} | {diff} | {ci(r)} | {p_value(r.get('p'))} |")
    lines += band_table(report)
    table = run_table(report)
    if table:
        lines += ["", "Run-level figures (metrics/eval.json of each run; 95% t interval over seeds, paired "
                  "by seed when both sides have the same seeds; none with one seed):", "",
                  "| " + " | ".join(RUN_HEADER) + " |",
                  "| --- | ---: | --- | ---: | --- | ---: | --- | ---: |"]
        lines += ["| " + " | ".join(row) + " |" for row in table]
    return "\n".join(lines) + "\n"
