"""The headline's outputs: both comparisons' reports, the exact-match figure, headline.json and
the plan's tables between its markers on the results page (docs/results.md by default; README.md
only links to that page, so a run never rewrites the front page).

A run-level cell shows the mean over seeds and the change to the baseline's:

    >>> _run_cell({"run_rows": [{"configuration": "a", "metric": "ppl", "value": 1.7046,
    ...                          "relative": 0.004}]}, "a", "ppl")
    '1.7046 (+0.4%)'
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

from rarelm.errors import RarelmError
from rarelm.files import atomic_file, write_json
from rarelm.report.compare import report_row
from rarelm.report.headline_plan import INSERTION_METRICS, RANK_SLICE, TIE_METRIC, TIE_METRICS
from rarelm.report.page import curve_svg, figures, write_report

START, END = "<!-- headline:start -->", "<!-- headline:end -->"


def markers(section: str) -> tuple[str, str]:
    """The results page's markers around a plan's tables.

    >>> markers("realtext-foldoc_en")
    ('<!-- realtext-foldoc_en:start -->', '<!-- realtext-foldoc_en:end -->')
    """
    return f"<!-- {section}:start -->", f"<!-- {section}:end -->"
# The final round's figures, by train-count band: the metric the plan ranks by, then exact match
# (on real text mostly 0 for every configuration, so it cannot show a remedy's effect alone).
FIGURES = {"nll_per_char": "term_nll_by_train_count.svg", "exact_match": "exact_match_by_train_count.svg"}
FIGURE_TITLES = {"nll_per_char": "term NLL per character by train count",
                 "exact_match": "exact match by train count"}


def read_json(path: Path) -> dict:
    """A JSON file's content, or {} if it is absent or not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def cpu_name() -> str:
    """The CPU's model name, as the rounds' durations are reported with it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ci(row: dict) -> str:
    """The difference to the baseline [95% interval]; a relative one (term perplexity) in percent.

    >>> _ci({"diff": -0.38, "diff_lo": -0.45, "diff_hi": -0.3, "diff_is_relative": True})
    '-38.0% [-45.0%, -30.0%]'
    >>> _ci({"diff": -0.1234, "diff_lo": -0.2, "diff_hi": -0.05})
    '-0.123 [-0.200, -0.050]'
    """
    if row.get("diff") is None:
        return ""
    if row.get("diff_is_relative") is True:
        return f"{row['diff']:+.1%} [{row['diff_lo']:+.1%}, {row['diff_hi']:+.1%}]"
    return f"{row['diff']:+.3f} [{row['diff_lo']:+.3f}, {row['diff_hi']:+.3f}]"


def _run_cell(report: dict, config: str, key: str) -> str:
    """A run-level figure's mean over seeds and its change to the baseline's, e.g. `1.7046 (+0.4%)`."""
    row = next((r for r in report.get("run_rows", []) if r["configuration"] == config and r["metric"] == key),
               None)
    if row is None:
        return "n/a"
    rel = f" ({row['relative']:+.1%})" if row.get("relative") is not None else ""
    return f"{row['value']:.4f}{rel}"


def table(report: dict, insertion: str = "false_insertion_rate") -> str:
    """Markdown: per configuration, the term metrics with differences and intervals (terms x seeds),
    overall perplexity and the false-insertion figure `insertion` beside the baseline's."""
    names = {"nll_per_char": "term NLL/char", "token_acc": "term-token acc", "term_ppl": "term ppl",
             "completion_match": "completion given 1st token", "exact_match": "exact match",
             "exact_match_ci": "exact match, any case", "prefix_share": "share of the term written"}
    metrics = [m for m in names if m in report["metrics"]]
    head = "".join(f" {names[m]} | diff [95% CI] |" for m in metrics)
    lines = [f"| configuration | seeds | terms |{head} ppl (vs baseline) | {INSERTION_METRICS[insertion]} "
             "(vs baseline) |",
             "| --- | ---: | ---: |" + " ---: | --- |" * len(metrics) + " ---: | ---: |"]
    for c in report["configurations"]:
        label = c["label"]
        cells = [label, str(len(c["runs"])), str(report["terms"])]
        for m in metrics:
            row = report_row(report, label, RANK_SLICE, m)
            cells += [f"{row['value']:.3f}", _ci(row)]
        cells += [_run_cell(report, label, "ppl"), _run_cell(report, label, insertion)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


MENTIONS = ("first mention", "repeat mention")
MENTION_METRICS = {"term_ppl": "term ppl", "exact_match": "exact match",
                   "completion_match": "completion given 1st token"}


def mention_table(report: dict) -> str:
    """Markdown: first mentions first, repeats beside them (a term's first mention, not yet in the
    context, is the case a user brings; a repeat is one a cache can copy): per configuration and
    mention, the occurrences, the term perplexity, the exact match and the completion given the
    term's first token, each with its change to the baseline [paired 95% interval]. "" if the
    report has none of them."""
    metrics = [m for m in MENTION_METRICS if m in report["metrics"]]
    if not metrics:
        return ""
    head = "".join(f" {mention}s: occurrences |" + "".join(f" {MENTION_METRICS[m]} | diff [95% CI] |"
                                                          for m in metrics) for mention in MENTIONS)
    lines = ["| configuration |" + head, "| --- |" + (" ---: |" + " ---: | --- |" * len(metrics)) * 2]
    for c in report["configurations"]:
        cells = [c["label"]]
        for mention in MENTIONS:
            rows = [report_row(report, c["label"], mention, m) for m in metrics]
            cells.append(str(rows[0].get("occurrences", "n/a")))
            for row in rows:
                cells += [_sig(row.get("value")), _ci(row)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def repeat_line(report: dict) -> str:
    """One sentence: how many of the baseline's scored occurrences repeat a term already in their
    document (the case a cache can copy) and, where eval.json has it, the share among all the split's
    occurrences; "" without mention rows.

    >>> row = {"configuration": "a", "aggregate": "occurrences", "metric": "term_ppl"}
    >>> line = repeat_line({"metrics": ["term_ppl"], "configurations": [{"label": "a"}], "rows": [
    ...     {**row, "slice": "first mention", "occurrences": 119},
    ...     {**row, "slice": "repeat mention", "occurrences": 175}],
    ...     "run_rows": [{"configuration": "a", "metric": "term_repeat_share_text", "value": 0.66}]})
    >>> print(line.replace("; ", ";\\n"))
    Repeat share: 175 of the 294 scored occurrences (59.5%) repeat a term already in their document;
    of all the split's occurrences, 66.0%.
    """
    metric = next((m for m in MENTION_METRICS if m in report["metrics"]), None)
    if metric is None:
        return ""
    base = report["configurations"][0]["label"]
    first, repeat = (report_row(report, base, mention, metric).get("occurrences") or 0
                     for mention in MENTIONS)
    if not first + repeat:
        return ""
    text = next((r["value"] for r in report.get("run_rows", [])
                 if r["configuration"] == base and r["metric"] == "term_repeat_share_text"), None)
    share = repeat / (first + repeat)
    return (f"Repeat share: {repeat} of the {first + repeat} scored occurrences ({share:.1%}) "
            "repeat a term already in their document" +
            (f"; of all the split's occurrences, {text:.1%}." if text is not None else "."))


RUN_TABLE = {"ppl": "ppl", "ppl_frequent": "frequent ppl", "ppl_medium": "medium ppl", "ppl_rare": "rare ppl",
             "ppl_general": "general-text ppl", "ppl_general_model": "general-text ppl, model alone",
             "ppl_general_outside": "general-text ppl outside the base's family",
             "false_insertion_rate": "false insertion"}


def _sig(x: float | None) -> str:
    """4 significant digits, whole numbers from 10,000 on, "n/a" for None.

    >>> _sig(55.21674), _sig(0.29113), _sig(351025.4), _sig(None)
    ('55.22', '0.2911', '351,025', 'n/a')
    """
    if x is None:
        return "n/a"
    return f"{x:,.0f}" if abs(x) >= 1e4 else f"{x:.4g}"


def _seed_cell(row: dict | None) -> str:
    """A run-level figure: mean over seeds [its 95% interval over seeds], and the change to the
    baseline's [interval] for the other configurations.

    >>> _seed_cell({"value": 55.2167, "value_lo": 55.1085, "value_hi": 55.3249, "diff": -370.46,
    ...             "diff_lo": -370.56, "diff_hi": -370.34, "relative": -0.8703})
    '55.22 [55.11, 55.32]; -370.5 [-370.6, -370.3] (-87.0%)'
    """
    if row is None:
        return "n/a"
    cell = _sig(row["value"])
    if row.get("value_lo") is not None:
        cell += f" [{_sig(row['value_lo'])}, {_sig(row['value_hi'])}]"
    if row.get("diff") is not None:
        cell += f"; {_sig(row['diff'])}"
        if row.get("diff_lo") is not None:
            cell += f" [{_sig(row['diff_lo'])}, {_sig(row['diff_hi'])}]"
        if row.get("relative") is not None:
            cell += f" ({row['relative']:+.1%})"
    return cell


def run_table(report: dict, insertion: str = "false_insertion_rate") -> str:
    """Markdown: per configuration, perplexity overall and by frequency bucket and the false-insertion
    rate (and the plan's guard figure `insertion` if another), each as mean over seeds with its
    interval over seeds (t, 95%) and the change to the baseline."""
    names = {**RUN_TABLE, insertion: INSERTION_METRICS[insertion]}
    value = {(r["configuration"], r["metric"]): r["value"] for r in report.get("run_rows", [])}
    # the model alone's general-text ppl only where some configuration mixes at decode time
    same = all(v == value.get((c, "ppl_general")) for (c, m), v in value.items() if m == "ppl_general_model")
    keys = [k for k in names if any(m == k for _, m in value) and not (k == "ppl_general_model" and same)]
    lines = ["| configuration | " + " | ".join(names[k] for k in keys) + " |",
             "| --- |" + " --- |" * len(keys)]
    for c in report["configurations"]:
        rows = {r["metric"]: r for r in report.get("run_rows", []) if r["configuration"] == c["label"]}
        lines.append("| " + " | ".join([c["label"], *(_seed_cell(rows.get(k)) for k in keys)]) + " |")
    return "\n".join(lines)


def results_section(result: dict, figures: dict[str, str]) -> str:
    """The results page's section of a plan, markers included: the rules, the rounds' tables, the
    figures (`figures`: metric -> the figure's path relative to the page)."""
    plan, screened = result["plan"], result.get("screen") is not None
    insertion = plan.get("insertion_metric", "false_insertion_rate")  # older headline.json: the rate
    start, end = markers(plan.get("section", "headline"))
    rounds = ", ".join(f"{k} {v / 60:.0f} min" for k, v in result["rounds_s"].items())
    machine = f"{result['cpu']} ({result['cores']} cores)" if "cores" in result else result["cpu"]
    origin = (f"Generated by `rarelm headline` (rarelm/report/headline.py), plan overrides "
              f"`{' '.join(plan['common'])}` and `eval.splits` of the round's split. Wall time of each "
              f"round in the command that finished it (a round resumed after an interruption counts "
              f"from the resume), on {machine}: {rounds}.")
    final_seeds = ", ".join(map(str, plan["final_seeds"]))
    if screened:
        combo = (f" The combination round merged: `{' '.join(result['combination'])}`."
                 if result["combination"] else "")
        origin += combo
        rules, title = _rules(plan), "Final round"
    else:
        rules = (f"A fixed comparison: every configuration on the {plan['final_split']} split with seeds "
                 f"{final_seeds}, each against the first, {next(iter(plan['configurations']))}; nothing "
                 "is chosen.")
        title = "Comparison"
    # first mentions lead (a term not yet in the document: the case users bring), repeats beside
    mentions = mention_table(result["final"])
    first = ["First mentions and repeats:", "", mentions, "", repeat_line(result["final"]), "",
             "All occurrences:", ""] if mentions else []
    lines = [start, origin, "", rules, "",
             f"**{title}** ({plan['final_split']} split, seeds {final_seeds}; intervals: paired bootstrap "
             "over terms and seeds together; ppl and false insertion: means over seeds):",
             "", *first, table(result["final"], insertion), "",
             "Per run (mean over seeds [95% interval over seeds]; change to the baseline [interval], "
             "paired by seed):", "", run_table(result["final"], insertion), "",
             " ".join(f"![{FIGURE_TITLES[m]}]({path})" for m, path in figures.items())]
    if screened:
        lines += ["", f"**Screening round** ({plan['screen_split']} split, seed(s) "
                      f"{', '.join(map(str, plan['screen_seeds']))}; finalists: "
                      f"{', '.join(result['finalists'])}):", "", table(result["screen"], insertion)]
    return "\n".join([*lines, end])


def _rules(plan: dict) -> str:
    """The rules of a plan that chooses, as fixed in it before any result was seen."""
    metric = plan.get("insertion_metric", "false_insertion_rate")
    insertion = "false-insertion rate" if metric == "false_insertion_rate" else \
        f"{INSERTION_METRICS[metric]} (`{metric}`)"
    general = (f", {plan.get('general_tolerance', 0.02):.0%} of its general-text perplexity"
               if any(o.startswith("eval.general_text=") and o.split("=", 1)[1].strip("'\"")
                      for o in plan["common"]) else "")
    tie = TIE_METRICS[plan.get("tie_metric", TIE_METRIC)]
    return (f"Rules fixed in the plan before any result was seen: configurations are chosen on the "
            f"{plan['screen_split']} split with seed(s) {', '.join(map(str, plan['screen_seeds']))}; only "
            f"those within {plan['ppl_tolerance']:.0%} of the baseline's overall perplexity"
            f"{general} and {plan['insertion_tolerance']:.0%} (relative) of its {insertion} are "
            f"ranked, by term NLL per character (then {tie}); the {plan['finalists']} best are confirmed on "
            f"the {plan['final_split']} split with seeds {', '.join(map(str, plan['final_seeds']))}, which "
            "took no part in the choice.")


def write_outputs(result: dict, out: Path, page: Path | None) -> None:
    """Both rounds' reports, the final round's figures (FIGURES), headline.json, and the plan's
    section on the results page `page` (None: leave it alone)."""
    for name in ("screen", "final"):
        if result[name] is not None:  # no screening round in a fixed comparison
            (out / name).mkdir(parents=True, exist_ok=True)
            write_report(result[name], out / name)
    plt = figures()
    if plt is not None:
        for metric, name in FIGURES.items():
            with atomic_file(out / name) as f:
                f.write(curve_svg(result["final"], plt, metric))
    write_json(out / "headline.json", {k: v for k, v in result.items() if k not in ("screen", "final")})
    if page is not None:
        start, end = markers(result["plan"].get("section", "headline"))
        try:
            text = page.read_text(encoding="utf-8")
        except OSError as e:
            raise RarelmError(f"{page}: cannot read the results page ({e.strerror})") from None
        if start not in text or end not in text:
            raise RarelmError(f"{page}: no {start} ... {end} markers for the plan's table")
        head, rest = text.split(start, 1)
        tail = rest.split(end, 1)[1]
        with atomic_file(page) as f:
            shown = {m: os.path.relpath(out / name, page.parent) for m, name in FIGURES.items()}
            f.write(head + results_section(result, shown) + tail)
