"""compare: replicate pooling, alignment, the report, and the CLI on real git, DVC experiments and a real
MLflow store (the per-occurrence rows are synthetic; no model is trained). The statistics by hand:
tests/test_statistics.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from rarelm.errors import RarelmError
from rarelm.fmt import four_decimals
from rarelm.paths import EVAL_METRICS, EVAL_OCCURRENCES
from rarelm.report.compare import compare as compare_runs
from rarelm.report.configurations import group_runs
from rarelm.report.git_runs import experiments_of_head
from rarelm.report.occurrences import METRICS, align
from rarelm.report.run_data import RunData, canonical, occurrence_key
from rarelm.report.runs import load_run
from rarelm.report.statistics import sign_test_p
from rarelm.report.tables import markdown as compare_markdown
from tests.conftest import assert_user_error, run, stage
from tests.helpers import EVALUATE_OUTPUTS, GEN, GENERATOR

# GENERATOR as the evaluate stage (tests/helpers.py: the per-occurrence rows of a synthetic model)
DVC_YAML = """stages:
  evaluate:
    cmd: python gen.py
    deps: [gen.py]
    params: [seed, alpha]
""" + EVALUATE_OUTPUTS


def _run_data(name: str, seed: int, alpha: float, rows: list[dict] | None = None) -> RunData:
    params = {"seed": canonical(seed), "alpha": canonical(alpha), "train.lr": "0.003"}
    rows = GEN["occurrence_rows"](seed, alpha) if rows is None else rows
    return RunData(name, name, "git", name, params, rows, GEN["summary"](seed, alpha))


def _em(rows: list[dict]) -> np.ndarray:
    return np.array([float(r["exact_match"]) for r in sorted(rows, key=occurrence_key)])


# ---------------------------------------------------------------- configurations


def test_replicates_are_pooled_per_occurrence():
    base = [_run_data("base-s1", 1, 0.0), _run_data("base-s2", 2, 0.0)]
    others = [_run_data("a07-s1", 1, 0.7), _run_data("a07-s2", 2, 0.7), _run_data("base-s3", 3, 0.0)]
    configs = group_runs(base, others)
    assert [c.label for c in configs] == ["baseline", "alpha=0.7"]
    assert [r.name for r in configs[0].runs] == ["base-s1", "base-s2", "base-s3"]  # a seed joins the baseline
    assert configs[1].seeds == ["1", "2"]
    # same params and a seed its configuration already has: not a replicate (another commit's code)
    again = group_runs(base, [*others, _run_data("new-code", 1, 0.0), _run_data("a07-again", 2, 0.7),
                                  _run_data("a07-s1", 1, 0.7)])  # the same run twice counts once
    assert [(c.label, c.seeds) for c in again] == [("baseline", ["1", "2", "3"]), ("alpha=0.7", ["1", "2"]),
                                                   ("new-code", ["1"]), ("alpha=0.7 (a07-again)", ["2"])]
    # configurations whose first three differences agree (the label shows three): labels stay distinct
    longer = []
    for steps in (600, 1200):
        run = _run_data(f"long-{steps}", 1, 0.7)
        run.params.update({"loss.a": "1", "loss.b": "2", "train.max_steps": str(steps)})
        longer.append(run)
    labels = [c.label for c in group_runs(base, longer)]
    assert labels[1:] == ["alpha=0.7, loss.a=1, loss.b=2 +1 more",
                          "alpha=0.7, loss.a=1, loss.b=2 +1 more (long-1200)"], labels
    occ, metrics = align(configs, list(METRICS))
    assert metrics == list(METRICS) and len(occ.terms) == 40
    expected = (_em(others[0].rows) + _em(others[1].rows)) / 2
    assert np.array_equal(configs[1].mean("exact_match"), expected)
    assert set(np.unique(expected)) <= {0.0, 0.5, 1.0} and 0.5 in expected
    assert np.array_equal(configs[0].values["exact_match"][2], _em(others[2].rows))
    report = compare_runs(base, others, n_boot=200, seed=0)
    row = next(r for r in report["rows"] if r["configuration"] == "alpha=0.7" and r["metric"] == "exact_match"
               and r["slice"] == "all" and r["aggregate"] == "occurrences")
    base_mean = np.mean([_em(r.rows) for r in (*base, others[2])], axis=0)
    assert row["value"] == pytest.approx(expected.mean())
    assert row["diff"] == pytest.approx(expected.mean() - base_mean.mean())
    assert row["diff_lo"] <= row["diff"] <= row["diff_hi"] and row["seeds"] == 2
    assert (row["baseline_seeds"], row["terms"]) == (3, 40)
    assert row["pooled_lo"] <= row["diff"] <= row["pooled_hi"]
    # run-level: ppl_rare = 38 - 5 alpha + seed % 3: 35.5, 36.5 (seeds 1, 2) vs 39, 40, 38 (seeds 1, 2, 3);
    # other seeds, so unpaired: -3 +- t(1) sqrt(0.5 / 2 + 1 / 3)
    rare = next(r for r in report["run_rows"]
                if r["configuration"] == "alpha=0.7" and r["metric"] == "ppl_rare")
    assert (rare["value"], rare["value_hi"]) == pytest.approx((36.0, 36.0 + 12.706 * 0.5))
    assert (rare["diff"], rare["diff_hi"]) == pytest.approx((-3.0, -3.0 + 12.706 * (0.5 / 2 + 1 / 3) ** 0.5))
    assert rare["relative"] == pytest.approx(36 / 39 - 1)


def test_runs_of_other_data_or_mixed_baselines_are_refused():
    base = _run_data("base", 1, 0.0)
    shifted = _run_data("other", 1, 0.7, [{**r, "char_start": r["char_start"] + 1}
                                          for r in GEN["occurrence_rows"](1, 0.7)])
    with pytest.raises(RarelmError, match="runs base and other were evaluated on different occurrences"):
        compare_runs([base], [shifted], n_boot=10)
    with pytest.raises(RarelmError, match="differ in more than the seed .alpha=0.7"):
        compare_runs([base, _run_data("b2", 2, 0.7)], [], n_boot=10)
    fewer = _run_data("fewer", 1, 0.7, GEN["occurrence_rows"](1, 0.7)[:-1])
    with pytest.raises(RarelmError, match="different occurrences"):
        compare_runs([base], [fewer], n_boot=10)


def test_a_metric_missing_in_a_run_is_left_out_and_slices_by_band():
    # older rows lack them
    newer = ("exact_match_ci", "completion_match", "prefix_share", "choice_rank", "nll_sum", "nll_per_char",
             "token_acc", "first_token_rr")
    old = _run_data("old", 1, 0.7, [{k: v for k, v in r.items() if k not in newer}
                                     for r in GEN["occurrence_rows"](1, 0.7)])
    report = compare_runs([_run_data("base", 1, 0.0)], [old], n_boot=50)
    assert report["metrics"] == ["exact_match", "first_token_acc", "nll", "term_ppl"]  # term_ppl: from nll
    assert report["left_out"] == ["exact_match_ci", "completion_match", "prefix_share", "choice_acc",
                                  "nll_per_char", "nll_per_term", "token_acc", "first_token_rr"]
    slices = list(dict.fromkeys(r["slice"] for r in report["rows"]))
    assert slices[:4] == ["all", "first mention", "repeat mention", "train_count<=15"]
    assert slices[4:7] == ["seen 0-1", "seen 2-15", "seen 16+"]
    assert slices[7:10] == ["band 0", "band 1", "band 2-3"]
    band = next(r for r in report["rows"] if r["slice"] == "band 0" and r["configuration"] == "baseline")
    assert band["occurrences"] == sum(1 + (7 * t) % 5 for t in range(40) if round(2 ** (t / 4)) - 1 == 0)


def test_strata_rows_and_term_perplexity_from_the_nll_rows():
    """Each train-count stratum (0-1, 2-15, 16+) is a slice of its own; term perplexity is exp of the
    NLL per term token, its difference the relative change exp(diff) - 1, interval mapped the same way."""
    base, other = _run_data("base", 1, 0.0), _run_data("a07", 1, 0.7)
    report = compare_runs([base], [other], n_boot=100, seed=0)
    counts = [round(2 ** (t / 4)) - 1 for t in range(40)]
    occurrences = {"seen 0-1": 0, "seen 2-15": 0, "seen 16+": 0}
    for t, count in enumerate(counts):
        label = "seen 0-1" if count <= 1 else "seen 2-15" if count <= 15 else "seen 16+"
        occurrences[label] += 1 + (7 * t) % 5
    for name, n in occurrences.items():
        row = next(r for r in report["rows"] if r["slice"] == name and r["metric"] == "exact_match"
                   and r["configuration"] == "alpha=0.7" and r["aggregate"] == "occurrences")
        assert row["occurrences"] == n and "diff_lo" in row, name
    for slice_ in ("all", "seen 0-1"):
        nll = next(r for r in report["rows"] if r["slice"] == slice_ and r["metric"] == "nll"
                   and r["configuration"] == "alpha=0.7" and r["aggregate"] == "occurrences")
        ppl = next(r for r in report["rows"] if r["slice"] == slice_ and r["metric"] == "term_ppl"
                   and r["configuration"] == "alpha=0.7" and r["aggregate"] == "occurrences")
        assert ppl["value"] == pytest.approx(np.exp(nll["value"]))
        assert (ppl["diff"], ppl["diff_lo"], ppl["diff_hi"]) == pytest.approx(
            tuple(np.expm1([nll["diff"], nll["diff_lo"], nll["diff_hi"]])))
        assert ppl["p"] == nll["p"] and ppl["diff_is_relative"] is True
    assert "term_ppl" in report["lower_is_better"]
    table = compare_markdown(report)
    line = next(x for x in table.splitlines() if "| term_ppl | all |" in x and x.startswith("| alpha=0.7"))
    # the difference and its interval in percent
    assert re.search(r"\| [+-]\d+\.\d% \| \[[+-]\d+\.\d%, [+-]\d+\.\d%\] \|", line), line
    assert "| seen 16+ |" in table


# ---------------------------------------------------------------- the CLI on real git + DVC


def _git_commit(root: Path, message: str) -> str:
    run(["git", "add", "-A"], root, check=True)
    run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", message], root, check=True)
    return run(["git", "rev-parse", "HEAD"], root, check=True).stdout.strip()


def _write_params(root: Path, seed: int, alpha: float) -> None:
    (root / "params.yaml").write_text(yaml.safe_dump({"seed": seed, "alpha": alpha}))


@pytest.fixture(scope="module")
def dvc_repo(tmp_path_factory) -> dict:
    """A git + DVC repo: no results at rev0, alpha 0.7's at rev1, the baseline's (alpha 0) at rev2 = HEAD,
    and three DVC experiments of HEAD: the baseline at seed 2, alpha 0.7 at seeds 1 and 2."""
    root = tmp_path_factory.mktemp("compare") / "repo"
    (root / "metrics").mkdir(parents=True)
    run(["git", "init", "-q"], root, check=True)
    run(["dvc", "init", "-q"], root, check=True)
    (root / "gen.py").write_text(GENERATOR)
    (root / "dvc.yaml").write_text(DVC_YAML)
    _write_params(root, 1, 0.0)
    revs = {"rev0": _git_commit(root, "no results yet")}
    for rev, alpha in (("rev1", 0.7), ("rev2", 0.0)):  # what `dvc repro` writes, without its seconds
        _write_params(root, 1, alpha)
        rows = GEN["occurrence_rows"](1, alpha)
        (root / EVAL_OCCURRENCES).write_text("".join(json.dumps(r) + "\n" for r in rows))
        (root / EVAL_METRICS).write_text(json.dumps(GEN["summary"](1, alpha)))
        revs[rev] = _git_commit(root, f"alpha {alpha}")
    for name, sets in (("base-s2", ["seed=2"]), ("a07-s1", ["alpha=0.7"]),
                       ("a07-s2", ["alpha=0.7", "seed=2"])):
        args = [x for s in sets for x in ("-S", s)]
        run(["dvc", "exp", "run", "--temp", "-q", "-n", name, *args], root, check=True)
    return {"root": root, **revs}


def _table(stdout: str) -> dict[tuple[str, str, str], list[str]]:
    """The difference table's cells by (configuration, metric, over): configuration, seeds, terms,
    metric, over, value, diff, 95% CI, p."""
    out = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 9 and cells[0] not in ("configuration", "---"):
            out[(cells[0], cells[3], cells[4])] = cells
    return out


def _run_table(stdout: str) -> dict[tuple[str, str], list[str]]:
    """The run-level table's cells by (configuration, metric)."""
    out = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 8 and cells[0] not in ("configuration", "---"):
            out[(cells[0], cells[2])] = cells
    return out


def _term_signs(config: list[dict], base: list[dict]) -> tuple[int, int]:
    """Terms whose exact match is higher / lower in config than in base, by hand."""
    def per_term(rows):
        out: dict[str, list[float]] = {}
        for r in rows:
            out.setdefault(r["term"], []).append(float(r["exact_match"]))
        return {t: np.mean(v) for t, v in out.items()}
    a, b = per_term(config), per_term(base)
    return sum(a[t] > b[t] for t in a), sum(a[t] < b[t] for t in a)


def test_cli_compares_two_git_revisions(dvc_repo, tmp_path):
    root, out = dvc_repo["root"], tmp_path / "report"
    result = stage("compare", root, dvc_repo["rev1"], "--baseline", dvc_repo["rev2"], "--out", str(out),
                   "--bootstrap", "1000")
    assert result.returncode == 0, result.stderr
    table = _table(result.stdout)
    base_em, method_em = _em(GEN["occurrence_rows"](1, 0.0)), _em(GEN["occurrence_rows"](1, 0.7))
    base_row = table[("baseline", "exact_match", "all")]
    method_row = table[("alpha=0.7", "exact_match", "all")]
    assert base_row[1] == method_row[1] == "1" and method_row[2] == "40"  # one seed, 40 terms
    assert float(base_row[5]) == pytest.approx(base_em.mean(), abs=5e-5)
    assert float(method_row[5]) == pytest.approx(method_em.mean(), abs=5e-5)
    diff = method_em.mean() - base_em.mean()
    assert float(method_row[6]) == pytest.approx(diff, abs=5e-5) and diff > 0.1
    lo, hi = map(float, re.fullmatch(r"\[(\S+), (\S+)\]", method_row[7]).groups())
    assert lo < diff < hi and lo > 0  # alpha 0.7 is clearly better in the generator
    b, c = _term_signs(GEN["occurrence_rows"](1, 0.7), GEN["occurrence_rows"](1, 0.0))
    assert float(method_row[8]) == pytest.approx(sign_test_p(b, c), rel=1e-2) and b > c
    assert ("alpha=0.7", "nll", "train_count<=15, per term") in table
    assert ("alpha=0.7", "nll_per_char", "all") in table and ("alpha=0.7", "token_acc", "all") in table
    # run-level: one seed a side, so a mean and no interval; 1.08 vs 1.01 is +6.9%
    inserted = _run_table(result.stdout)[("alpha=0.7", "false_insertion_rate")]
    assert inserted[1] == "1" and float(inserted[3]) == pytest.approx(1.08) and inserted[4] == ""
    assert inserted[7] == "+6.9%"
    page = (out / "index.html").read_text()
    assert page.count("<svg") == 3 and "First and repeat mentions" in page and "<script" not in page
    assert "term-only intervals" in page
    report = json.loads((out / "report.json").read_text())
    assert report["occurrences"] == len(base_em) and report["terms"] == 40
    assert (out / "report.md").read_text() == result.stdout
    # the table by train-count band: each band's row, from report.json's band rows
    bands = [r for r in report["rows"] if r["configuration"] == "alpha=0.7" and r["metric"] == "nll_per_char"
             and r["aggregate"] == "occurrences" and r["slice"].startswith("band ")]
    assert len(bands) > 3
    for row in bands:
        line = next(x for x in result.stdout.splitlines() if x.startswith(f"| {row['slice'][5:]} ("))
        assert f"| {four_decimals(row['diff'], True)} [{four_decimals(row['diff_lo'], True)}, " in line
    # the same bootstrap seed gives the same table
    again = stage("compare", root, dvc_repo["rev1"], "--baseline", dvc_repo["rev2"], "--bootstrap", "1000")
    assert again.stdout == result.stdout


def test_cli_pools_the_dvc_experiments_of_head(dvc_repo, tmp_path):
    root = dvc_repo["root"]
    assert experiments_of_head(root) == ["a07-s1", "a07-s2", "base-s2"]
    result = stage("compare", root, "--experiments", "--baseline", "workspace", "--bootstrap", "300",
                   "--metric", "exact_match", "--out", str(tmp_path / "r"))
    assert result.returncode == 0, result.stderr
    assert "- **baseline**: workspace (seed 1), base-s2 (seed 2)" in result.stdout
    assert "- **alpha=0.7**: a07-s1 (seed 1), a07-s2 (seed 2)" in result.stdout
    table = _table(result.stdout)
    assert {k[1] for k in table} == {"exact_match"}
    pooled = (_em(GEN["occurrence_rows"](1, 0.7)) + _em(GEN["occurrence_rows"](2, 0.7))) / 2
    base = (_em(GEN["occurrence_rows"](1, 0.0)) + _em(GEN["occurrence_rows"](2, 0.0))) / 2
    row = table[("alpha=0.7", "exact_match", "all")]
    assert row[1] == "2" and float(row[5]) == pytest.approx(pooled.mean(), abs=5e-5)
    assert float(row[6]) == pytest.approx(pooled.mean() - base.mean(), abs=5e-5)
    assert "each row's interval rests on its seeds (the baseline's: 2) and terms" in result.stdout
    # an experiment by name, against a revision
    named = stage("compare", root, "a07-s2", "--baseline", "HEAD", "--bootstrap", "100")
    assert named.returncode == 0, named.stderr
    assert "- **alpha=0.7, seed" not in named.stdout and "a07-s2 (seed 2)" in named.stdout


def test_cli_errors_are_one_line(dvc_repo, tmp_path):
    root = dvc_repo["root"]
    out = tmp_path / "r"
    cases = [
        (["no-such-exp", "--baseline", dvc_repo["rev1"]], "no-such-exp: not a DVC experiment, git revision"),
        ([dvc_repo["rev1"], "--baseline", dvc_repo["rev0"]], "no metrics/eval_occurrences.jsonl at"),
        ([dvc_repo["rev1"], "--baseline", dvc_repo["rev2"], "--metric", "bleu"],
         "--metric bleu is not allowed"),
    ]
    for args, message in cases:
        assert_user_error(stage("compare", root, *args, "--out", str(out)), message, tmp_path, "r",
                          stage="compare")


# ---------------------------------------------------------------- the CLI on a real MLflow store


def _mlflow_run(client, experiment: str, root: Path, name: str, seed: int, alpha: float,
                with_rows: bool = True, with_model: bool = False) -> str:
    """An evaluated run in a real store as evaluate leaves it (params, eval/ artifacts), optionally
    with a logged model (a real MLflow LoggedModel, no weights); returns its id."""
    from mlflow.entities import LoggedModelOutput

    from rarelm.params import Params

    params = Params.from_dict({"seed": seed, "alpha": alpha}).flat()
    mlrun = client.create_run(experiment, run_name=name)
    for key, value in params.items():
        client.log_param(mlrun.info.run_id, key, json.dumps(value) if isinstance(value, list) else value)
    client.log_metric(mlrun.info.run_id, "summary/ppl", GEN["summary"](seed, alpha)["ppl"])
    folder = root / name / "eval"
    folder.mkdir(parents=True)
    (folder / "eval.json").write_text(json.dumps(GEN["summary"](seed, alpha)))
    if with_rows:
        rows = GEN["occurrence_rows"](seed, alpha)
        (folder / "eval_occurrences.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    client.log_artifacts(mlrun.info.run_id, str(folder), "eval")
    if with_model:
        model = client.create_logged_model(experiment, name="model", source_run_id=mlrun.info.run_id)
        client.log_outputs(mlrun.info.run_id, [LoggedModelOutput(model.model_id, 0)])
    client.set_terminated(mlrun.info.run_id)
    return mlrun.info.run_id


def test_cli_compares_mlflow_runs_by_id(tmp_path, monkeypatch):
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("rarelm", artifact_location=str(tmp_path / "artifacts"))
    ids = {name: _mlflow_run(client, experiment, tmp_path, name, seed, alpha, with_rows)
           for name, seed, alpha, with_rows in (("base", 1, 0.0, True), ("a07", 1, 0.7, True),
                                                ("old", 1, 0.7, False))}
    env = {"MLFLOW_TRACKING_URI": uri}
    result = stage("compare", tmp_path, ids["a07"], "--baseline", ids["base"], "--bootstrap", "500",
                   "--log-mlflow", env=env)
    assert result.returncode == 0, result.stderr
    table = _table(result.stdout)
    base_em, method_em = _em(GEN["occurrence_rows"](1, 0.0)), _em(GEN["occurrence_rows"](1, 0.7))
    row = table[("alpha=0.7", "exact_match", "all")]
    assert float(row[6]) == pytest.approx(method_em.mean() - base_em.mean(), abs=5e-5)
    assert f"a07 ({ids['a07'][:8]}) (seed 1)" in result.stdout
    logged = {a.path for a in client.list_artifacts(ids["base"], "compare")}
    assert logged == {"compare/index.html", "compare/report.md", "compare/report.json"}
    assert_user_error(stage("compare", tmp_path, ids["old"], "--baseline", ids["base"], env=env),
                      "MLflow run has no artifact eval/eval_occurrences.jsonl", tmp_path, stage="compare")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the CLI's one-line path is the same as above
    with pytest.raises(RarelmError, match=f"{'0' * 32}: no such MLflow run in {uri}"):
        load_run("0" * 32)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'elsewhere.db'}")
    with pytest.raises(RarelmError, match="no MLflow store at sqlite:///"):
        load_run(ids["base"])
    assert not (tmp_path / "elsewhere.db").exists()


def test_cli_registers_the_winner_and_leaves_the_champion(tmp_path, monkeypatch):
    """`rarelm compare --register` on a real store: the best configuration (lowest term NLL/char,
    baseline included) becomes a new version described as `rarelm register` describes one, plus how
    it was chosen; the `champion` alias stays. A winner that logged no model: one line, no report."""
    import mlflow

    from rarelm.tracking import registry

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the registry resolves models:/ through it
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("rarelm", artifact_location=str(tmp_path / "artifacts"))
    ids = {name: _mlflow_run(client, experiment, tmp_path, name, 1, alpha, with_model=model)
           for name, alpha, model in (("base", 0.0, True), ("a03", 0.3, True), ("a07", 0.7, True),
                                      ("a10", 1.0, False))}
    (tmp_path / "params.yaml").write_text("tracking: {experiment: rarelm, registered_model: rarelm-win}\n")
    assert registry.register(client, "rarelm-win", ids["base"], champion=True) == "1"
    env = {"MLFLOW_TRACKING_URI": uri}

    result = stage("compare", tmp_path, ids["a03"], ids["a07"], "--baseline", ids["base"], "--bootstrap",
                   "200", "--metric", "nll_per_char", "--register", env=env)
    assert result.returncode == 0, result.stderr
    nll = {c[0]: float(c[5]) for c in _table(result.stdout).values() if c[4] == "all"}
    assert min(nll, key=nll.get) == "alpha=0.7"  # what the table shows is what wins
    assert f"rarelm compare: registered the winner alpha=0.7 (run {ids['a07']}) as models:/rarelm-win/2" \
        in result.stderr
    version = client.get_model_version("rarelm-win", "2")
    winner = client.get_run(ids["a07"])
    assert version.run_id == ids["a07"] and version.description.splitlines() == [
        *registry.description(winner).splitlines(),
        "chosen: rarelm compare, best nll_per_char over all occurrences among 3 configurations, baseline "
        "included: alpha=0.7, seed 1 (run 1 of 1)"]
    assert version.tags == {"experiment": "a07", "summary/ppl": f"{GEN['summary'](1, 0.7)['ppl']:.6g}"}
    assert str(client.get_model_version_by_alias("rarelm-win", "champion").version) == "1"

    assert_user_error(stage("compare", tmp_path, ids["a10"], "--baseline", ids["base"], "--bootstrap", "200",
                            "--register", "--out", str(tmp_path / "r"), env=env),
                      f"run {ids['a10']} (a10) logged no model", tmp_path, "r", stage="compare")
    assert sorted(int(v.version) for v in client.search_model_versions("name = 'rarelm-win'")) == [1, 2]


def test_term_nll_of_another_tokenizer_is_over_the_baselines_tokens():
    """Terms as tokens: a term the remedy's tokenizer writes in one token holds its whole NLL in it;
    its NLL per term token (and so term perplexity) is taken over the baseline's token count of that
    occurrence, the same characters' NLL over the same count. Where the counts agree, unchanged."""
    base_rows = [dict(r, n_tokens=2) for r in GEN["occurrence_rows"](1, 0.0)]
    one_token = [dict(r, n_tokens=1 if i % 2 == 0 else 2,
                      nll=r["nll_sum"] if i % 2 == 0 else r["nll"])
                 for i, r in enumerate(GEN["occurrence_rows"](1, 0.7))]
    base, other = _run_data("base", 1, 0.0, base_rows), _run_data("a07", 1, 0.7, one_token)
    configs = group_runs([base], [other])
    align(configs, ["nll"])
    expected = [r["nll_sum"] / 2 if i % 2 == 0 else r["nll"] for i, r in enumerate(one_token)]
    by_key = dict(zip(map(occurrence_key, one_token), expected, strict=True))
    assert configs[1].values["nll"][0] == pytest.approx([by_key[k] for k in sorted(by_key)])


def test_perplexities_of_another_tokenizer_are_over_the_baselines_tokens():
    """The run table's and the guard's perplexities (ppl, ppl_general): the same text's NLL over the
    baseline's token count, exp(ln(ppl) x n / n_base), so 99 tokens at 10.3 read as 100 at 10.06."""
    from rarelm.report.compare import run_rows
    from rarelm.report.winner import within_guard
    base, other = _run_data("base", 1, 0.0), _run_data("a07", 1, 0.7)
    base.summary.update(ppl=10.0, n_eval_tokens=100, ppl_general=50.0, n_general_tokens=40)
    other.summary.update(ppl=10.3, n_eval_tokens=99, ppl_general=50.0, n_general_tokens=40)
    rows = {(r["configuration"], r["metric"]): r for r in run_rows(group_runs([base], [other]))}
    assert rows["alpha=0.7", "ppl"]["value"] == pytest.approx(10.3 ** 0.99)
    assert rows["alpha=0.7", "ppl_general"]["value"] == 50.0
    assert within_guard(other.summary, base.summary, {"ppl": 0.01})  # 10.06 <= 10.1
    assert not within_guard(dict(other.summary, n_eval_tokens=100), base.summary, {"ppl": 0.01})
