"""`make show` and `make diff`: the summary metrics of DVC experiments first, in <= 160 columns.

`dvc exp show` opens on the same summary metrics (metrics/summary.json, the one file dvc.yaml
declares as metrics), then has ~190 columns of every param and dep hash in file order. `show`
prints the `summary/` family (rarelm.tracking.metrics.SUMMARY) under short headers, then every
param whose value differs
between the rows, whole; params that do not fit the width go to a second block with the
experiment names again. `diff` prints two revisions or experiments side by side, one row per
summary metric, with the change, then the params that differ. `dvc exp show` and
`dvc exp diff A B` stay the full views.

    >>> rows = [{"name": "workspace", "ppl": 1.70659, "seed": 1337.0, "alpha": 0.0},
    ...         {"name": "swift-fawn", "ppl": 1.8, "seed": 1.0, "alpha": 0.0}]
    >>> print(render_show(rows, ["ppl"], varied_params(rows, ["seed", "alpha"])))
    Experiment  ppl    seed
    workspace   1.707  1337
    swift-fawn  1.8    1
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import typer

from rarelm.errors import RarelmError, user_errors
from rarelm.tracking.metrics import leaves

WIDTH = 160
# the summary metrics in rarelm.tracking.metrics.SUMMARY's order (what to read first), under
# headers short enough that eleven of them and an experiment name fit 160 columns; LEGEND spells
# them out under the table
HEADERS = {"term_nll_per_char": "nll/char", "term_token_acc": "tok_acc", "term_exact_match": "exact",
           "term_exact_match_le15": "exact_le15", "false_insertion_rate": "false_ins", "ppl": "ppl",
           "ppl_frequent": "ppl_freq", "em50_train_count": "em50_n", "ppl_general": "ppl_gen",
           "ppl_general_outside": "ppl_out", "tokens_per_s": "tok/s"}
LEGEND = ("nll/char: term NLL per character (lower is better); tok_acc, exact, exact_le15: term token "
          "accuracy, exact match, exact match of terms seen <= 15 times in train; false_ins: false "
          "insertion rate; ppl, ppl_freq: perplexity, frequent bucket; em50_n: train count at 50% exact "
          "match; ppl_gen, ppl_out: general-text perplexity (forgetting), on text of the base's own kind "
          "and from outside its pretraining family; tok/s: training tokens/s. Every figure: "
          "metrics/eval.json.")
SEP = "  "


def format_value(value: Any) -> str:
    """A cell: numbers to 4 significant digits, whole numbers without ".0", the rest whole.

    >>> [format_value(v) for v in (0.036655, 2862.1, 1337.0, None, "rare_bucket", ["val", "test"])]
    ['0.03666', '2862', '1337', '-', 'rare_bucket', "['val', 'test']"]
    """
    if value is None:
        return "-"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def aligned(header: list[str], cells: list[list[str]]) -> list[str]:
    """Columns padded to their widest cell, two spaces apart, no trailing blanks."""
    rows = [header, *cells]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return [SEP.join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def column_width(rows: list[dict], key: str, header: str) -> int:
    return max(len(header), *(len(format_value(row.get(key))) for row in rows))


def varied_params(rows: list[dict], params: list[str]) -> list[str]:
    """The params whose value differs between the rows, in the given order.

    >>> varied_params([{"a": 1, "b": 2}, {"a": 1, "b": 3}], ["a", "b"])
    ['b']
    """
    return [p for p in params if len({format_value(row.get(p)) for row in rows}) > 1]


def render_show(rows: list[dict], metrics: list[str], params: list[str], width: int = WIDTH) -> str:
    """Name, metrics and as many params as fit `width`; the other params in further blocks.

    >>> rows = [{"name": "a", "ppl": 1.5, "loss.targets": "term_tokens", "train.lr": 0.001}]
    >>> print(render_show(rows, ["ppl"], ["loss.targets", "train.lr"], width=26))
    Experiment  ppl
    a           1.5
    <BLANKLINE>
    Experiment  loss.targets
    a           term_tokens
    <BLANKLINE>
    Experiment  train.lr
    a           0.001
    """
    name_width = column_width(rows, "name", "Experiment")
    blocks = [[("name", "Experiment")] + [(m, HEADERS.get(m, m)) for m in metrics]]
    used = name_width + sum(len(SEP) + column_width(rows, m, h) for m, h in blocks[0][1:])
    for param in params:
        needed = len(SEP) + column_width(rows, param, param)
        if used + needed > width and len(blocks[-1]) > 1:
            blocks.append([("name", "Experiment")])
            used = name_width
        blocks[-1].append((param, param))
        used += needed
    tables = []
    for block in blocks:
        if len(block) > 1 or block is blocks[0]:
            cells = [[format_value(row.get(key)) for key, _ in block] for row in rows]
            tables.append("\n".join(aligned([h for _, h in block], cells)))
    return "\n\n".join(tables)


def render_diff(a: str, b: str, metrics: dict[str, tuple[Any, Any]],
                params: dict[str, tuple[Any, Any]]) -> str:
    """One row per summary metric (A, B, B - A, relative change), then the params that differ.

    >>> print(render_diff("main", "exp-1", {"ppl": (1.7, 1.87)}, {"alpha": (0.0, 0.7)}))
    metric  main  exp-1  change  relative
    ppl     1.7   1.87   +0.17   +10.0%
    <BLANKLINE>
    param  main  exp-1
    alpha  0     0.7
    """
    def change(old: Any, new: Any) -> list[str]:
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (old, new)):
            return ["-", "-"]
        relative = f"{(new - old) / abs(old):+.1%}" if old else "-"
        return [f"{new - old:+.4g}", relative]

    cells = [[name, format_value(old), format_value(new), *change(old, new)]
             for name, (old, new) in metrics.items()]
    out = "\n".join(aligned(["metric", a, b, "change", "relative"], cells))
    if params:
        rows = [[name, format_value(old), format_value(new)] for name, (old, new) in params.items()]
        out += "\n\n" + "\n".join(aligned(["param", a, b], rows))
    return out


def param_names(params_file: Path) -> set[str]:
    """The dotted names of params.yaml's leaves, as `dvc exp show` names its param columns."""
    import yaml

    return set(leaves(yaml.safe_load(params_file.read_text(encoding="utf-8")) or {}))


def experiment_rows(repo: Path) -> tuple[list[dict], list[str]]:
    """`dvc exp show`'s rows (workspace, HEAD, HEAD's experiments) named, with the param columns.

    A column that two files share carries its file (`params.yaml:alpha`); it is read back as
    `alpha` here."""
    import dvc.api

    names = param_names(repo / "params.yaml")
    rows, params = [], []
    for raw in dvc.api.exp_show(repo=str(repo)):
        row = {"name": raw.get("Experiment") or raw["rev"]}
        for column, value in raw.items():
            key = column.removeprefix("params.yaml:")
            if key in names:
                row[key] = value
                if key not in params:
                    params.append(key)
            elif ":" not in column or column.startswith("metrics/"):
                row.setdefault(column.split(":")[-1], value)
        rows.append(row)
    return rows, params


def experiment_diff(repo: Path, a: str, b: str | None) -> tuple[dict, dict]:
    """Summary metrics (all) and params (those that differ) of two revisions or experiments, from
    `dvc exp diff --all --json` (B absent: the workspace)."""
    command = [sys.executable, "-m", "dvc", "exp", "diff", "--all", "--json", a, *([b] if b else [])]
    done = subprocess.run(command, cwd=repo, capture_output=True, text=True)
    if done.returncode != 0:
        reason = (done.stderr.strip().splitlines() or ["dvc exp diff failed"])[-1]
        raise RarelmError(f"cannot compare {a} with {b or 'the workspace'}: {reason}")
    found = json.loads(done.stdout or "{}")
    metrics = {key: (v.get("old"), v.get("new")) for values in found.get("metrics", {}).values()
               for key, v in values.items() if key in HEADERS}
    params = {key: (v.get("old"), v.get("new")) for values in found.get("params", {}).values()
              for key, v in values.items() if v.get("old") != v.get("new")}
    if not metrics:
        return {}, params
    # a metric null on both sides (em50_train_count where exact match never crosses 50%) is left out
    # by dvc; summary.json holds every header, so its row stays, "-" on both sides
    return {m: metrics.get(m, (None, None)) for m in HEADERS}, params


app = typer.Typer(add_completion=False, help=__doc__.split("\n\n")[0])


@app.command()
def show(repo: Path = typer.Option(Path("."), help="the DVC repository")) -> None:
    """The workspace, HEAD and HEAD's experiments: summary metrics, then the params that differ."""
    with user_errors("show"):
        rows, params = experiment_rows(repo)
        metrics = [m for m in HEADERS if any(m in row for row in rows)]
        print(render_show(rows, metrics, varied_params(rows, params)))
        print()
        print(wrapped(LEGEND))


@app.command()
def diff(a: str = typer.Argument("HEAD", help="a git revision or DVC experiment name"),
         b: str = typer.Argument(None, help="another one (default: the workspace)"),
         repo: Path = typer.Option(Path("."), help="the DVC repository")) -> None:
    """Two revisions or experiments: the summary metrics side by side, then the params that differ."""
    with user_errors("diff"):
        metrics, params = experiment_diff(repo, a, b)
        if not metrics:
            raise RarelmError(f"no summary metrics in {a} or {b or 'the workspace'} (metrics/summary.json)")
        print(render_diff(a, b or "workspace", metrics, params))
        print(f"\nEvery metric: dvc exp diff {a}{' ' + b if b else ''} --all")


def wrapped(text: str, width: int = WIDTH) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


if __name__ == "__main__":
    app()
