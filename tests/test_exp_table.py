"""rarelm/report/exp_table.py: `make show` and `make diff` fit 160 columns, summary metrics first."""

from __future__ import annotations

import json
import subprocess
import sys

from rarelm.report.exp_table import (
    HEADERS,
    LEGEND,
    WIDTH,
    format_value,
    render_diff,
    render_show,
    varied_params,
    wrapped,
)
from rarelm.tracking.metrics import SUMMARY
from tests.conftest import REPO


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rarelm.report.exp_table", *args], cwd=REPO,
                          capture_output=True, text=True)


def test_headers_are_the_mlflow_summary_family_in_its_order():
    assert list(HEADERS) == list(SUMMARY.values())
    assert all(short in LEGEND for short in HEADERS.values())


def test_eleven_metrics_and_long_params_fit_160_columns_with_every_value_whole():
    name = "term-loss-normalized-s3-x"  # 25 characters, longer than DVC's generated names
    long_values = {"loss.targets": "term_tokens_and_term_starts", "eval.splits": ["val", "test"],
                   "model.name_or_path": "base/model", "train.max_steps": 1000.0, "loss.rare_weight": 3.0,
                   "tokenizer.name_or_path": "base/model", "weights.score": "term_occurrence"}
    rows = [{"name": name, **{m: 123.456789 for m in HEADERS}, **long_values},
            {"name": "workspace", **{m: 0.0366552 for m in HEADERS}, **{k: "x" for k in long_values}}]
    params = varied_params(rows, list(long_values))
    assert params == list(long_values)
    shown = render_show(rows, list(HEADERS), params)
    lines = shown.splitlines()
    assert max(map(len, lines)) <= WIDTH
    assert len(HEADERS) == 11 and lines[0].split()[:12] == ["Experiment", *HEADERS.values()]
    assert lines[1].split()[:3] == [name, "123.5", "123.5"] and lines[2].split()[1] == "0.03666"
    for key, value in long_values.items():  # each param once, its value whole
        assert shown.count(f" {key}") == 1
        assert format_value(value) in shown and len(format_value(value)) >= len(str(value).removesuffix(".0"))
    assert shown.count("Experiment") == 2  # the params that did not fit: a second block


def test_params_that_do_not_vary_are_not_shown():
    rows = [{"name": "a", "ppl": 1.5, "seed": 1.0, "alpha": 0.7}, {"name": "b", "ppl": 1.6, "seed": 2.0,
                                                                    "alpha": 0.7}]
    assert render_show(rows, ["ppl"], varied_params(rows, ["alpha", "seed"])).splitlines() == [
        "Experiment  ppl  seed", "a           1.5  1", "b           1.6  2"]


def test_diff_gives_change_and_relative_change_and_the_params_that_differ():
    shown = render_diff("main", "exp", {"term_nll_per_char": (0.05, 0.04), "ppl": (2.0, None)},
                        {"loss.targets": ("rare_bucket", "term_tokens")})
    assert shown.splitlines() == [
        "metric             main  exp   change  relative",
        "term_nll_per_char  0.05  0.04  -0.01   -20.0%",
        "ppl                2     -     -       -",
        "",
        "param         main         exp",
        "loss.targets  rare_bucket  term_tokens"]


def test_legend_wraps_to_the_width():
    assert max(map(len, wrapped(LEGEND).splitlines())) <= WIDTH
    assert " ".join(wrapped(LEGEND).split()) == " ".join(LEGEND.split())


def test_show_on_this_repo_fits_and_reads_the_committed_metrics():
    done = _run("show")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(map(len, lines)) <= WIDTH
    eval_json = json.loads((REPO / "metrics/eval.json").read_text())
    header = lines[0].split()
    workspace = next(line.split() for line in lines if line.startswith("workspace "))
    assert header[0] == "Experiment" and header[1:4] == ["nll/char", "tok_acc", "exact"]
    assert float(workspace[header.index("ppl")]) == float(f"{eval_json['ppl']:.4g}")


def test_diff_of_head_with_the_workspace_and_a_bad_revision():
    done = _run("diff", "HEAD")
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines() if line.strip()}
    assert rows["metric"] == ["metric", "HEAD", "workspace", "change", "relative"]
    assert list(rows)[1:1 + len(HEADERS)] == list(HEADERS)
    bad = _run("diff", "no-such-rev-or-exp")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1
    assert "cannot compare no-such-rev-or-exp with the workspace" in bad.stderr


def test_make_show_and_make_diff_run_this_module():
    makefile = (REPO / "Makefile").read_text()
    assert "\t@python -m rarelm.report.exp_table show\n" in makefile
    assert "\t@python -m rarelm.report.exp_table diff $(A) $(B)\n" in makefile and "\nA ?= HEAD\n" in makefile
