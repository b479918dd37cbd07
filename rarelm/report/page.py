"""The HTML view of a comparison report: one self-contained page with its figures inline as SVG.

matplotlib is optional: without it the page says so where the figures would be. The SVG is
reproducible (fixed hash salt, no date), so the same report gives the same bytes:

    >>> _table(["a", "b"], [["<1>", 2]])
    '<table><thead><tr><th>a</th><th>b</th></tr></thead><tbody><tr><td>&lt;1&gt;</td><td>2</td></tr></tbody></table>'
"""

from __future__ import annotations

import html
import io
from pathlib import Path
from typing import Any

from rarelm.files import atomic_file, write_json
from rarelm.fmt import four_decimals, p_value
from rarelm.report.occurrences import LOWER_IS_BETTER
from rarelm.report.tables import RUN_HEADER, ci, diff_cell, main_rows, markdown, over, rests_on, run_table

PPL_KEYS = ("ppl_frequent", "ppl_medium", "ppl_rare", "ppl_term")


def figures() -> Any:
    """matplotlib.pyplot with the Agg backend and reproducible SVG, or None without matplotlib."""
    try:
        import matplotlib  # optional: the page says so where the figures would be
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.hashsalt": "rarelm", "svg.fonttype": "none", "font.size": 9})
    return plt


def _svg(plt, fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def curve_svg(report: dict, plt, metric: str = "exact_match") -> str:
    """A metric per train-count band, one line per configuration with its bootstrap band."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    xs = report["curve_x"]
    for c in report["configurations"]:
        rows = [r for r in report["rows"] if r["configuration"] == c["label"] and r["metric"] == metric
                and r["aggregate"] == "occurrences" and r["slice"] in xs]
        rows.sort(key=lambda r: xs[r["slice"]])
        x = [xs[r["slice"]] for r in rows]
        label = f"{c['label']} ({len(c['runs'])} seed{'s' if len(c['runs']) > 1 else ''})"
        line, = ax.plot(x, [r["value"] for r in rows], marker="o", label=label)
        ax.fill_between(x, [r["value_lo"] for r in rows], [r["value_hi"] for r in rows],
                        color=line.get_color(), alpha=0.15, linewidth=0)
    ax.set_xscale("symlog", linthresh=1)
    if metric not in LOWER_IS_BETTER:
        ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("train count of the term (mean of its band; log scale)")
    ax.set_ylabel({"exact_match": "term exact match", "nll_per_char": "term NLL per character (nats)"}
                  .get(metric, metric))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _svg(plt, fig)


def ppl_svg(report: dict, plt) -> str | None:
    """Perplexity per token bucket (eval.json, mean over seeds), grouped bars per configuration."""
    keys = [k for k in PPL_KEYS if any(k in c["summary"] for c in report["configurations"])]
    if not keys:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    width = 0.8 / len(report["configurations"])
    for i, c in enumerate(report["configurations"]):
        x = [j + i * width for j, k in enumerate(keys) if k in c["summary"]]
        bars = ax.bar(x, [c["summary"][k] for k in keys if k in c["summary"]], width, label=c["label"])
        ax.bar_label(bars, fmt="%.3g", fontsize=7)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))], [k.removeprefix("ppl_") for k in keys])
    ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # optional, as in figures()

    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylabel("perplexity (log scale)")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    return _svg(plt, fig)


def _table(header: list[str], body: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
                   for row in body)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"


def _table_bodies(report: dict) -> tuple[list[list], list[list], list[list]]:
    """The cells of the page's mention, difference and term-only (pooled) tables."""
    mention = [[r["configuration"], r["metric"], r["slice"], r["occurrences"], four_decimals(r["value"]),
                ci(r, "value")]
               for r in report["rows"] if r["aggregate"] == "occurrences"
               and r["slice"] in ("first mention", "repeat mention")]
    diffs = [[r["configuration"], r["seeds"], r["terms"], r["metric"], over(r), four_decimals(r["value"]),
              diff_cell(r) if "diff" in r else "", ci(r), p_value(r.get("p"))]
             for r in main_rows(report)]
    pooled = [[r["configuration"], r["seeds"], r["terms"], r["metric"], over(r),
               diff_cell(r), ci(r), ci(r, "pooled")]
              for r in main_rows(report) if "diff" in r]
    return mention, diffs, pooled


def html_report(report: dict) -> str:
    """One self-contained page: figures inline as SVG, the difference, run-level and mention tables, and
    the term-only intervals (seeds averaged per occurrence) as a secondary view."""
    plt = figures()
    curves = []
    for metric in ("exact_match", "nll_per_char"):
        if metric in report["metrics"]:
            curves.append(f"<h2>{html.escape(metric)} by the term's train count</h2>\n"
                          + (curve_svg(report, plt, metric) if plt else "<p>(figures need matplotlib)</p>"))
    ppl = (ppl_svg(report, plt) if plt else None) or "<p>(no per-bucket perplexity, or no matplotlib)</p>"
    mention, diffs, pooled = _table_bodies(report)
    runs = "".join(f"<li><b>{html.escape(c['label'])}</b>: "
                   + html.escape(", ".join(f"{r['name']} (seed {r['seed']})" for r in c["runs"])) + "</li>"
                   for c in report["configurations"])
    style = ("body{font-family:sans-serif;max-width:60em;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;font-size:90%}td,th{border:1px solid #ccc;padding:2px 6px}"
             "td:nth-child(n+4){text-align:right}svg{max-width:100%;height:auto}")
    newline = "\n"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>rarelm compare</title><style>{style}</style></head>
<body>
<h1>rarelm compare</h1>
<ul>{runs}</ul>
<p>{html.escape(rests_on(report))} Replicates (runs differing only by seed) are drawn with the terms in
every resample.</p>
{newline.join(curves)}
<h2>Perplexity by token bucket</h2>
{ppl}
<h2>Differences to the baseline</h2>
{_table(["configuration", "seeds", "terms", "metric", "over", "value", "diff vs baseline", "95% CI", "p"],
        diffs)}
<h2>Run-level figures (eval.json, intervals over seeds)</h2>
{_table(RUN_HEADER, run_table(report))}
<h2>First and repeat mentions</h2>
{_table(["configuration", "metric", "mention", "occurrences", "value", "95% CI"], mention)}
<h2>Secondary: term-only intervals, seeds averaged per occurrence</h2>
<p>The interval earlier versions reported: terms resampled, each occurrence's value averaged over the
seeds first, so training noise is only in it as far as the seeds average it out. Beside the
terms-and-seeds interval for comparison.</p>
{_table(["configuration", "seeds", "terms", "metric", "over", "diff", "95% CI (terms x seeds)",
         "95% CI (terms only)"], pooled)}
</body></html>
"""


def write_report(report: dict, out: str | Path) -> list[Path]:
    """index.html, report.md and report.json in `out`, each written atomically."""
    out = Path(out)
    page = html_report(report)
    paths = [out / "index.html", out / "report.md", out / "report.json"]
    with atomic_file(paths[0]) as f:
        f.write(page)
    with atomic_file(paths[1]) as f:
        f.write(markdown(report))
    write_json(paths[2], report)
    return paths
