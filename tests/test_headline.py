"""The headline experiment's machinery on a real git + DVC repo, with stand-in stages.

The repo's `train` stage writes a "model" (its params) and counts its own runs; `evaluate` turns
it into the per-occurrence rows of tests/helpers.py's GENERATOR, where a larger effective
alpha writes more terms, for a val and a test split (other outcomes on each). Real `dvc exp run
--queue`, `dvc queue start`, run cache and `rarelm.report.compare`; no model is trained, so the three
rounds take seconds, not 90 minutes.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from rarelm.errors import RarelmError
from rarelm.report import headline as hl
from rarelm.report.compare import report_row
from rarelm.report.dvc_queue import existing
from rarelm.report.git_runs import experiment_refs
from rarelm.report.headline_outputs import END, FIGURES, START, results_section, table
from rarelm.report.headline_plan import PREFIX, Plan
from rarelm.report.records import record, recorded
from tests.conftest import REPO, run
from tests.helpers import EVALUATE_OUTPUTS, GENERATOR, overridden

TRAIN = """
import sys, yaml
p = yaml.safe_load(open("params.yaml"))
open("model.txt", "w").write(f"{p['seed']} {p['alpha']} {p['beta']}")
open(sys.argv[1], "a").write(f"{p['seed']} {p['alpha']} {p['beta']}\\n")
"""
EVALUATE = GENERATOR.split('if __name__ == "__main__":')[0] + """
import os
seed, alpha, beta = open("model.txt").read().split()
tau = yaml.safe_load(open("params.yaml"))["tau"]
os.makedirs("metrics", exist_ok=True)
effective = float(alpha) + float(beta) - 0.5 * tau
splits = yaml.safe_load(open("params.yaml"))["eval"]["splits"]  # test: seed; val: seed + 100
shift = {"test": 0, "val": 100}
with open("metrics/eval_occurrences.jsonl", "w") as f:
    f.writelines(json.dumps({**r, "split": s}) + "\\n"
                 for s in splits for r in occurrence_rows(int(seed) + shift[s], effective))
with open("metrics/eval.json", "w") as f:  # the first split on top, the others nested
    json.dump({**summary(int(seed) + shift[splits[0]], effective),
               **{s: summary(int(seed) + shift[s], effective) for s in splits[1:]}}, f)
"""
PLAN = {"common": [], "screen_seeds": [1], "final_seeds": [2, 3], "finalists": 1,
        "combine": 2,  # one method: nothing to combine
        "configurations": {"baseline": [], "good": ["alpha=0.7"]},
        "decode": {"tuned": {"of": "baseline", "set": ["tau=0.2"]}}}


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("headline") / "repo"
    (root / "metrics").mkdir(parents=True)
    trained = root.parent / "trained.log"
    run(["git", "init", "-q"], root, check=True)
    run(["dvc", "init", "-q"], root, check=True)
    (root / "train.py").write_text(TRAIN)
    (root / "evaluate.py").write_text(EVALUATE)
    (root / "params.yaml").write_text(yaml.safe_dump({"seed": 1, "alpha": 0.0, "beta": 0.0, "tau": 0.0,
                                                      "eval": {"splits": ["val", "test"]}}))
    (root / "dvc.yaml").write_text(f"""stages:
  train:
    cmd: python train.py {trained}
    deps: [train.py]
    params: [seed, alpha, beta]
    outs: [model.txt]
  evaluate:
    cmd: python evaluate.py
    deps: [evaluate.py, model.txt]
    params: [tau, eval.splits]
{EVALUATE_OUTPUTS}""")
    (root / "plan.yaml").write_text(yaml.safe_dump(PLAN))
    (root / "results.md").write_text(f"# demo\n\nbefore\n\n{START}\nold table\n{END}\n\nafter\n")
    (root / ".gitignore").write_text("/model.txt\n")
    run(["git", "add", "-A"], root, check=True)
    run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"], root, check=True)
    log: list[str] = []
    try:
        result = hl.headline(root, Plan.load(root / "plan.yaml"), root / "reports", root / "results.md",
                             log=log.append, poll=1)
    except RarelmError as exc:  # say why: the queue as DVC sees it, and each failed experiment's log
        report = [str(exc), "--- headline's log:", *log, "--- dvc queue status:",
                  run(["dvc", "queue", "status"], root).stdout]
        for name in re.findall(rf"{PREFIX}[\w-]+", str(exc)):
            queue_log = run(["dvc", "queue", "logs", name], root).stdout
            report += [f"--- dvc queue logs {name}:", queue_log[-2000:]]
        pytest.fail("\n".join(report))
    return {"root": root, "result": result, "log": log, "trained": trained}


def test_the_rounds_run_the_plan(repo):
    root, result = repo["root"], repo["result"]
    names = {n for n in existing(root) if n.startswith(PREFIX)}
    assert names == {"hl-baseline-s1", "hl-good-s1", "hl-tuned-s1", "hl-baseline-s2", "hl-good-s2",
                     "hl-baseline-s3", "hl-good-s3"}
    assert result["combination"] == [] and result["finalists"] == ["good"]
    # ranked by term NLL per character on val: good lowers it, tuned (effective alpha -0.1) raises it
    assert [n for n, _ in result["ranking"]] == ["good", "tuned"]
    assert result["ranking"][0][1] < 0 < result["ranking"][1][1]
    assert set(result["rounds_s"]) == {"screen", "confirm"}
    # the decode variant re-used the baseline's trained model: 6 trainings for 7 experiments
    trained = repo["trained"].read_text().splitlines()
    assert sorted(trained) == sorted(f"{s} {a} 0.0" for s in (1, 2, 3) for a in ("0.0", "0.7"))
    # each round evaluated only the split it is judged on: no test figure in a screening run
    for name, _, commit in experiment_refs(root):
        rows = run(["git", "show", f"{commit}:metrics/eval_occurrences.jsonl"], root, check=True).stdout
        splits = {json.loads(r)["split"] for r in rows.splitlines()}
        assert splits == {"val" if name.endswith("-s1") else "test"}, name


def test_the_combination_round_merges_the_best_two_and_replicates_the_best(monkeypatch, tmp_path):
    """The rounds' logic with the experiments faked (the DVC side is the test above)."""
    plan = Plan(common=["train.max_steps=5"], screen_seeds=[7], final_seeds=[8], finalists=2, combine=2,
                configurations={"baseline": [], "a": ["loss.targets=terms", "loss.rare_weight=2"],
                                "b": ["loss.rare_weight=4"], "c": ["alpha=1"]},
                decode={"d": {"of": "c", "set": ["eval.logit_adjust_tau=0.5"]}})
    gains = {"a": 0.3, "b": 0.25, "c": 0.2, "d": 0.1, "combination": 0.5}
    batches: list[tuple[str, list]] = []
    monkeypatch.setattr(hl, "run_batch", lambda repo, batch, log, poll, **kw: batches.append(batch) or 0)
    monkeypatch.setattr(hl, "record", lambda repo, out, name: None)
    monkeypatch.setattr(hl, "ranking", lambda repo, out, plan, names, seeds: sorted(
        ((n, gains[n]) for n in names), key=lambda x: -x[1]))
    monkeypatch.setattr(hl, "_compare", lambda *args: {})
    monkeypatch.setattr(hl, "write_outputs", lambda *args: None)
    result = hl.headline(tmp_path, plan, tmp_path / "out", None, log=lambda m: None)
    screen, combine, replicate = batches
    assert [n for n, _ in screen] == ["hl-baseline-s7", "hl-a-s7", "hl-b-s7", "hl-c-s7", "hl-d-s7"]
    assert dict(screen)["hl-d-s7"] == ["train.max_steps=5", "eval.splits=[val]", "seed=7", "alpha=1",
                                       "eval.logit_adjust_tau=0.5"]
    # a and c: b's loss.rare_weight clashes with a's
    assert combine == [("hl-combination-s7", ["train.max_steps=5", "eval.splits=[val]", "seed=7",
                                              "loss.targets=terms", "loss.rare_weight=2", "alpha=1"])]
    assert result["finalists"] == ["combination", "a"]
    assert [n for n, _ in replicate] == ["hl-baseline-s8", "hl-combination-s8", "hl-a-s8"]
    assert {tuple(sets[:2]) for _, sets in replicate} == {("train.max_steps=5", "eval.splits=[test]")}
    assert set(result["rounds_s"]) == {"screen", "combine", "confirm"}


def test_reports_and_results_page_tables(repo):
    root, result = repo["root"], repo["result"]
    final = json.loads((root / "reports" / "final" / "report.json").read_text())
    assert [c["label"] for c in final["configurations"]] == ["baseline", "good"]
    assert [c["seeds"] for c in final["configurations"]] == [["2", "3"], ["2", "3"]]  # fresh seeds only
    assert final["splits"] == ["test"]
    screen = json.loads((root / "reports" / "screen" / "report.json").read_text())
    assert [c["label"] for c in screen["configurations"]] == ["baseline", "good", "tuned"]
    assert screen["splits"] == ["val"] and [c["seeds"] for c in screen["configurations"]] == [["1"]] * 3
    # the guard reads val's eval.json figures: the stand-in's summary at seed 101 (1 + 100)
    assert screen["configurations"][0]["summary"]["false_insertion_rate"] == pytest.approx(1.02)
    for name in FIGURES.values():
        assert (root / "reports" / name).read_text().startswith("<svg")
    assert "term NLL per character (nats)" in (root / "reports" / FIGURES["nll_per_char"]).read_text()
    page = (root / "results.md").read_text()  # the results page, never README.md
    assert page.startswith("# demo\n\nbefore\n\n") and page.endswith("\n\nafter\n")
    assert "old table" not in page
    assert (f"![term NLL per character by train count]({Path('reports') / FIGURES['nll_per_char']}) "
            f"![exact match by train count]({Path('reports') / FIGURES['exact_match']})") in page
    assert f"{START}\nGenerated by `rarelm headline` (rarelm/report/headline.py)" in page
    assert f"({os.cpu_count()} cores): screen " in page
    rows = [line for line in page.splitlines() if line.startswith("| good |")]
    assert len(rows) == 4  # first mentions and repeats, all occurrences, per-run figures, screening
    assert page.index("First mentions and repeats:") < page.index("All occurrences:")  # they lead
    mentions = [c.strip() for c in rows[0].strip("|").split("|")]
    first = report_row(result["final"], "good", "first mention", "completion_match")
    repeat = report_row(result["final"], "good", "repeat mention", "completion_match")
    first_exact = report_row(result["final"], "good", "first mention", "exact_match")
    assert mentions[1] == str(first["occurrences"]) and mentions[6] == f"{first['value']:.4g}"
    assert mentions[4] == f"{first_exact['value']:.4g}"
    assert mentions[5] == (f"{first_exact['diff']:+.3f} [{first_exact['diff_lo']:+.3f}, "
                           f"{first_exact['diff_hi']:+.3f}]")
    assert mentions[8] == str(repeat["occurrences"]) and mentions[13] == f"{repeat['value']:.4g}"
    cells = [c.strip() for c in rows[1].strip("|").split("|")]
    per_char = report_row(result["final"], "good", "all", "nll_per_char")
    assert cells[1:3] == ["2", "40"] and cells[3] == f"{per_char['value']:.3f}"
    assert cells[4] == f"{per_char['diff']:+.3f} [{per_char['diff_lo']:+.3f}, {per_char['diff_hi']:+.3f}]"
    assert per_char["diff_hi"] < 0  # alpha 0.7 lowers term NLL clearly in the generator
    header = next(line for line in page.splitlines() if line.startswith("| configuration | seeds | terms |"))
    column = {name: i for i, name in enumerate(c.strip() for c in header.strip("|").split("|"))}
    exact = report_row(result["final"], "good", "all")
    assert cells[column["exact match"]] == f"{exact['value']:.3f}" and exact["diff_lo"] > 0
    # any case: the stand-in writes every term as the text does
    assert cells[column["exact match, any case"]] == cells[column["exact match"]]
    nll = report_row(result["final"], "good", "all", "term_ppl")  # term perplexity: exp of NLL per token
    assert cells[column["term ppl"]] == f"{nll['value']:.3f}"
    assert cells[column["term ppl"] + 1] == (f"{nll['diff']:+.1%} [{nll['diff_lo']:+.1%}, "
                                             f"{nll['diff_hi']:+.1%}]")
    ppl = np.mean([1.9 - 0.07] * 2)  # the stand-in's ppl at alpha 0.7, both seeds
    assert cells[column["ppl (vs baseline)"]] == f"{ppl:.4f} ({ppl / 1.9 - 1:+.1%})"
    # false-insertion rate: seeds 2, 3 -> 1.09, 1.07 vs 1.02, 1.00
    assert cells[column["false insertion (vs baseline)"]] == "1.0800 (+6.9%)"
    by_mass = table(result["final"], "false_insertion_start_mass").splitlines()  # a plan guarding it
    assert by_mass[0].endswith("| ppl (vs baseline) | term-start mass off terms (vs baseline) |")
    assert "and 10% (relative) of its false-insertion rate are ranked" in page
    per_run = [c.strip() for c in rows[2].strip("|").split("|")]
    ppl_row = next(r for r in result["final"]["run_rows"]
                   if r["configuration"] == "good" and r["metric"] == "ppl")
    assert per_run[1].startswith(f"{ppl:.4g} [") and f"({ppl / 1.9 - 1:+.1%})" in per_run[1]
    assert ppl_row["value_lo"] == pytest.approx(ppl)  # both seeds give the same stand-in ppl
    assert "took no part in the choice" in page


def test_an_interrupted_headline_resumes_without_rerunning(repo):
    root = repo["root"]
    summary = root / "reports" / "headline.json"
    measured = summary.read_text()
    # as if the rounds had run on another machine: a rewrite keeps the machine with the times
    summary.write_text(json.dumps({**json.loads(measured), "cpu": "Earlier CPU", "cores": 64}))
    log: list[str] = []
    again = hl.headline(root, Plan.load(root / "plan.yaml"), root / "reports", None,
                        log=log.append, poll=1)
    summary.write_text(measured)
    assert not any(line.startswith("queue") for line in log)
    assert again["finalists"] == repo["result"]["finalists"]
    assert again["rounds_s"] == repo["result"]["rounds_s"]  # the times measured when they ran
    assert (again["cpu"], again["cores"]) == ("Earlier CPU", 64)  # and where they ran
    assert len(repo["trained"].read_text().splitlines()) == 6


def test_a_fresh_clone_rewrites_the_reports_from_the_records(repo, tmp_path):
    """Every experiment is recorded under <out>/runs/ as it finishes; a clone without the experiments
    (git clone does not fetch refs/exps/) but with the records rewrites the same comparisons and runs
    nothing; a plan stopped part-way resumes there."""
    root = repo["root"]
    records = root / "reports" / "runs"
    assert recorded(root / "reports") == {n for n in existing(root) if n.startswith(PREFIX)}
    commit = (records / "hl-good-s2" / "commit").read_text().strip()
    assert commit == dict((n, c) for n, _, c in experiment_refs(root))["hl-good-s2"]
    shown = run(["git", "show", f"{commit}:metrics/eval_occurrences.jsonl"], root, check=True).stdout
    stored = gzip.decompress((records / "hl-good-s2" / "metrics/eval_occurrences.jsonl.gz").read_bytes())
    assert stored.decode() == shown
    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(root), str(clone)], tmp_path, check=True)
    assert existing(clone) == set()
    shutil.copytree(records, clone / "reports" / "runs")
    log: list[str] = []
    again = hl.headline(clone, Plan.load(clone / "plan.yaml"), clone / "reports", None, log=log.append,
                        poll=1)
    assert not any(line.startswith("queue") for line in log) and existing(clone) == set()
    assert again["final"]["rows"] == repo["result"]["final"]["rows"]
    assert again["screen"]["rows"] == repo["result"]["screen"]["rows"]
    assert len(repo["trained"].read_text().splitlines()) == 6
    # a record without its commit file (an interrupted write) is not one: that experiment runs again
    (clone / "reports/runs/hl-good-s3/commit").unlink()
    assert "hl-good-s3" not in recorded(clone / "reports")
    with pytest.raises(RarelmError, match="hl-nothing-s1: neither a DVC experiment of .* nor recorded"):
        record(clone, clone / "reports", "hl-nothing-s1")


def test_the_screening_so_far_compares_what_finished_and_queues_nothing(repo, tmp_path):
    """`rarelm headline --so-far` while a long screening runs: finished configurations against the
    baseline on val with the plan's guard; the one not run yet is named, none is queued."""
    root = repo["root"]
    plan = {**PLAN, "configurations": {**PLAN["configurations"], "later": ["alpha=0.3"]}}
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump(plan))
    before = existing(root)
    log: list[str] = []
    report = hl.so_far(root, Plan.load(tmp_path / "plan.yaml"), tmp_path / "out", log=log.append)
    assert existing(root) == before
    assert [c["label"] for c in report["configurations"]] == ["baseline", "good", "tuned"]
    assert report["splits"] == ["val"]
    screen = json.loads((root / "reports" / "screen" / "report.json").read_text())  # the full round's
    row = report_row(report, "good", "all", "nll_per_char")
    assert row == report_row(screen, "good", "all", "nll_per_char") and row["diff_hi"] < 0
    written = json.loads((tmp_path / "out" / "screen_so_far" / "report.json").read_text())
    assert written["rows"] == report["rows"]
    # the stand-in at effective alpha a: ppl 1.9 - 0.1 a, false insertion 1.02 + 0.1 a on val (seed 101):
    # good (0.7) 1.83 and 1.09 (+6.9%), tuned (-0.1) 1.91 (+0.5%) and 1.01: both within 2% and 10%
    assert log[0] == ("2 of 3 configurations screened (val split, seeds 1); within the guard, best first: "
                      "good, tuned; not yet: later")
    assert log[1].startswith("| configuration |") and "| good | 1 |" in log[1]
    with pytest.raises(RarelmError, match="hl-baseline-s9 has not finished yet"):
        hl.so_far(root, dataclasses.replace(Plan.load(tmp_path / "plan.yaml"), screen_seeds=[9]), tmp_path)
    (tmp_path / "fixed.yaml").write_text(yaml.safe_dump({**plan, "screen_seeds": []}))
    refused = run(["rarelm", "headline", "--plan", str(tmp_path / "fixed.yaml"),
                   "--out", str(tmp_path / "no"), "--so-far"], root)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "has no screening round" in refused.stderr and not (tmp_path / "no").exists()
    cli = run(["rarelm", "headline", "--plan", str(tmp_path / "plan.yaml"), "--out", str(tmp_path / "cli"),
               "--so-far"], root, check=True)
    assert cli.stdout.splitlines()[0] == log[0] and (tmp_path / "cli/screen_so_far/index.html").is_file()
    assert existing(root) == before


def test_a_plan_without_screen_seeds_is_a_fixed_comparison(monkeypatch, tmp_path):
    """Every configuration straight to the final seeds under the plan's prefix; its own markers on the
    results page."""
    (tmp_path / "plan.yaml").write_text("common: [train.max_steps=300, 'eval.splits=[val, test]']\n"
                                        "screen_seeds: []\n"
                                        "final_seeds: [1, 2]\nprefix: rt-foldoc_en-\n"
                                        "section: realtext-foldoc_en\n"
                                        "configurations: {base: [train.max_steps=0], finetune: []}\n")
    plan = Plan.load(tmp_path / "plan.yaml")
    batches: list[list] = []
    monkeypatch.setattr(hl, "run_batch", lambda repo, batch, log, poll, **kw: batches.append(batch) or 0)
    monkeypatch.setattr(hl, "record", lambda repo, out, name: None)
    monkeypatch.setattr(hl, "_compare", lambda repo, out, plan, base, names, seeds, split: {"names": names})
    written: list[dict] = []
    monkeypatch.setattr(hl, "write_outputs", lambda result, out, page: written.append(result))
    monkeypatch.setattr(hl, "_log_sweep", lambda *args: None)
    result = hl.headline(tmp_path, plan, tmp_path / "out", None, log=lambda m: None)
    common = ["train.max_steps=300", "eval.splits=[test]"]  # the round's split replaces common's
    assert batches == [[("rt-foldoc_en-base-s1", [*common, "seed=1", "train.max_steps=0"]),
                        ("rt-foldoc_en-finetune-s1", [*common, "seed=1"]),
                        ("rt-foldoc_en-base-s2", [*common, "seed=2", "train.max_steps=0"]),
                        ("rt-foldoc_en-finetune-s2", [*common, "seed=2"])]]
    assert result["screen"] is None and result["final"] == {"names": ["finetune"]}
    assert result["finalists"] == ["finetune"] and set(result["rounds_s"]) == {"confirm"}
    result["final"] = {"metrics": [], "configurations": []}
    section = results_section(result, {"exact_match": "fig.svg"})
    assert section.startswith("<!-- realtext-foldoc_en:start -->\nGenerated by `rarelm headline`")
    assert section.endswith("<!-- realtext-foldoc_en:end -->") and "Screening" not in section
    assert "A fixed comparison: every configuration on the test split with seeds 1, 2, each against the " \
           "first, base; nothing is chosen." in section


def test_bad_plans_are_one_line(tmp_path):
    seeds = "screen_seeds: [1]\nfinal_seeds: [2]\n"
    cases = [(seeds, "not a headline plan"),
             ("screen_seeds: [1]\nfinal_seeds: []\nconfigurations: {baseline: []}\n", "needs final_seeds"),
             ("screen_seeds: []\nfinal_seeds: [1]\nprefix: 'a b'\nconfigurations: {baseline: []}\n",
              "prefix and section must be"),
             (seeds + "configurations: {baseline: []}\ndecode: {x: {of: nope, set: [a=1]}}\n",
              "unknown configuration 'nope'"),
             ("screen_seeds: [1]\nfinal_seeds: [2, 1]\nconfigurations: {baseline: []}\n",
              "final_seeds repeat screening seed 1"),
             (seeds + "configurations: {baseline: []}\ninsertion_metric: ppl_rare\n",
              "insertion_metric 'ppl_rare' is not one of false_insertion_rate, false_insertion_rate_chars, "
              "false_insertion_start_mass"),
             (seeds + "configurations: {baseline: []}\ntie_metric: exact_match\n",
              "tie_metric 'exact_match' is not one of token_acc, completion_match"),
             (": [\n", "cannot read")]
    for text, message in cases:
        path = tmp_path / "plan.yaml"
        path.write_text(text)
        with pytest.raises(RarelmError, match=message):
            Plan.load(path)


def test_ranking_guards_overall_perplexity_and_false_insertion(monkeypatch):
    plan = Plan(common=[], screen_seeds=[1], final_seeds=[2], decode={},
                   configurations={"baseline": [], "a": ["x=1"], "b": ["y=1"], "c": ["z=1"], "d": ["w=1"],
                                   "e": ["v=1"]})
    # ppl: +1.6%, +4% (out), +1.99%, +0%, +0%; false insertion: +0%, +0%, +9.9%, +12% (out), +0%
    summaries = {"baseline": (2.0, 1.0), "a": (2.032, 1.0), "b": (2.08, 1.0), "c": (2.0398, 1.099),
                 "d": (2.0, 1.12), "e": (2.0, 1.0)}
    per_char = {"a": -0.1, "b": -0.3, "c": -0.2, "d": -0.4, "e": -0.1}
    token_acc = {"a": 0.01, "b": 0.0, "c": 0.0, "d": 0.0, "e": 0.05}  # breaks the a / e tie
    rows = [{"configuration": k, "slice": "all", "aggregate": "occurrences", "metric": m, "diff": v[k]}
            for m, v in (("nll_per_char", per_char), ("token_acc", token_acc)) for k in per_char]
    report = {"configurations": [{"label": k, "summary": {"ppl": p, "false_insertion_rate": f}}
                                 for k, (p, f) in summaries.items()], "rows": rows}
    monkeypatch.setattr(hl, "_compare", lambda *args: report)
    ranked = hl.ranking(Path("."), Path("."), plan, ["a", "b", "c", "d", "e"], [1])
    assert ranked == [("c", -0.2), ("e", -0.1), ("a", -0.1)]

    # a plan guarding the term-start mass instead: its figures decide, the sampled rate does not
    mass = {"baseline": 0.10, "a": 0.111, "b": 0.10, "c": 0.10, "d": 0.10, "e": 0.1099}  # a +11%: out
    for c in report["configurations"]:
        c["summary"]["false_insertion_start_mass"] = mass[c["label"]]
    by_mass = dataclasses.replace(plan, insertion_metric="false_insertion_start_mass")
    assert hl.guard(by_mass) == {"ppl": 0.02, "false_insertion_start_mass": 0.10, "ppl_general_model": 0.02,
                                 "ppl_general_outside": 0.02}
    assert hl.ranking(Path("."), Path("."), by_mass, ["a", "b", "c", "d", "e"], [1]) == [
        ("d", -0.4), ("c", -0.2), ("e", -0.1)]
    # with general text scored (eval.general_text) forgetting is guarded too: c's +5% is out; d's
    # decode-time mixture is +10% on general text, but the model alone forgot nothing: d stays
    for c in report["configurations"]:
        c["summary"]["ppl_general_model"] = 52.5 if c["label"] == "c" else 50.0
        c["summary"]["ppl_general"] = {"c": 52.5, "d": 55.0}.get(c["label"], 50.0)
    assert hl.ranking(Path("."), Path("."), by_mass, ["a", "b", "c", "d", "e"], [1]) == [
        ("d", -0.4), ("e", -0.1)]
    # forgetting on general text from outside the base's family guards too, on its own: e's +3% there
    # is out though its in-family figure is the baseline's
    for c in report["configurations"]:
        c["summary"]["ppl_general_outside"] = 103.0 if c["label"] == "e" else 100.0
    assert hl.ranking(Path("."), Path("."), by_mass, ["a", "b", "c", "d", "e"], [1]) == [("d", -0.4)]
    for c in report["configurations"]:
        c["summary"]["ppl_general_outside"] = 100.0
    # a plan breaking ties by the completion given the first token: a beats e there
    rows += [{"configuration": k, "slice": "all", "aggregate": "occurrences", "metric": "completion_match",
              "diff": {"a": 0.02, "e": 0.01}.get(k, 0.0)} for k in per_char]
    by_completion = dataclasses.replace(plan, tie_metric="completion_match")
    assert hl.ranking(Path("."), Path("."), plan, ["a", "b", "c", "d", "e"], [1]) == [
        ("e", -0.1), ("a", -0.1)]
    assert hl.ranking(Path("."), Path("."), by_completion, ["a", "b", "c", "d", "e"], [1]) == [
        ("a", -0.1), ("e", -0.1)]


# --------------------------------------------------------------------------- the real-text plans (issue 22)

REALTEXT_PLANS = sorted((REPO / "realtext").glob("*.yaml"))


def _params_of(overrides: list[str]):
    """params.yaml with `dvc exp run -S` overrides applied (an override of a key params.yaml does
    not have fails, as DVC refuses it), validated into Params."""
    from rarelm.params import Params

    return Params.from_dict(overridden(yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8")),
                                       overrides))


@pytest.mark.parametrize("path", REALTEXT_PLANS, ids=lambda p: p.stem)
def test_every_real_text_experiment_sets_existing_params_to_valid_values(path):
    """A dry listing of each plan: every experiment of its first round, overrides on params.yaml."""
    plan = Plan.load(path)
    names = [*plan.configurations, *plan.decode]
    listing = plan.batch(names, plan.screen_seeds or plan.final_seeds, {},
                         plan.screen_split if plan.screen_seeds else plan.final_split)
    assert len(listing) == len(names) * len(plan.screen_seeds or plan.final_seeds)
    for _, overrides in listing:
        params = _params_of(overrides)
        assert params.model.name_or_path == "base/model" and params.corpus.path.startswith("data/raw/")


@pytest.mark.parametrize("plan_name", ["trained_foldoc_en", "trained_manpages_zh", "retrieval_foldoc_en",
                                       "retrieval_manpages_zh", "knn_manpages_zh", "trie_manpages_zh",
                                       "trie_foldoc_en", "knn_foldoc_en"])
def test_v4_plans_judge_against_the_fine_tune_that_make_realtext_trains(plan_name):
    """realtext/<kind>_<corpus>.yaml's baseline is realtext/<corpus>.yaml's fine-tune: the same train
    work (keyed by the params dvc.yaml declares, as rarelm run-plan and DVC's run cache key it), so
    the remedies are read against the fine-tune at its best and the plans share its three models."""
    from rarelm.report.plan_runner import plan_tasks

    corpus = plan_name.split("_", 1)[1]
    trainings = {}
    for name in (corpus, plan_name):
        plan = Plan.load(REPO / "realtext" / f"{name}.yaml")
        with pytest.MonkeyPatch.context() as patch:  # plan_tasks writes each task's params.yaml
            patch.setattr("rarelm.report.plan_runner._write_params", lambda root, params: None)
            tasks, _ = plan_tasks(plan, REPO, Path("/nonexistent-work"), [])
        finetune = [task for exp, task in tasks.items() if exp.startswith(f"{plan.prefix}finetune-s")]
        trainings[name] = sorted(task.after[0] for task in finetune)
        assert len(finetune) == 3 and plan.final_seeds == [1, 2, 3] and plan.final_split == "test"
        assert all(folder.startswith("train-") for folder in trainings[name])
    assert trainings[corpus] == trainings[plan_name]  # the same three trainings
    plan = Plan.load(REPO / "realtext" / f"{plan_name}.yaml")
    assert plan.insertion_metric == "false_insertion_rate_chars" and not plan.screen_seeds
    if plan_name.startswith("trained_"):
        assert set(plan.configurations) == {"finetune", "term-loss", "replay-1", "terms-as-tokens"}


@pytest.mark.parametrize("corpus", ["foldoc_en", "manpages_zh"])
def test_real_text_headline_plans_fix_issue_22s_rules_before_the_results(corpus):
    from rarelm.report.headline_plan import RANK_METRIC, TIE_METRIC

    plan = Plan.load(REPO / "realtext" / f"headline_{corpus}.yaml")
    assert (plan.baseline, plan.screen_seeds, plan.final_seeds) == ("finetune", [1337], [1, 2, 3])
    assert (plan.screen_split, plan.final_split, plan.finalists) == ("val", "test", 2)
    assert (plan.ppl_tolerance, plan.insertion_tolerance) == (0.02, 0.10)
    # foldoc_en keeps the sampled rate it screened with; manpages_zh, not run yet, the start mass
    assert plan.insertion_metric == {"foldoc_en": "false_insertion_rate",
                                     "manpages_zh": "false_insertion_start_mass"}[corpus]
    assert (RANK_METRIC, TIE_METRIC) == ("nll_per_char", "token_acc")
    assert plan.prefix == f"rh-{corpus}-"
    runs = {name: _params_of([*plan.common, *plan.overrides(name, {})]) for name in plan.configurations}
    steps = {name: params.train.max_steps for name, params in runs.items()}
    assert steps["finetune"] == 300 and steps["finetune-longer"] == 570  # 300 x 1.9: the KL's step cost
    losses = {name: params.loss for name, params in runs.items()}
    assert losses["kl-base"].kl_base > 0 and losses["unlikelihood"].unlikelihood > 0
    assert losses["term-loss-after-first"].targets == "terms_after_first"
    assert losses["term-loss-normalized"].normalize == "targets"
    assert [losses[f"term-loss-normalized{w}"].rare_weight for w in ("", "-w4", "-w8")] == [2, 4, 8]
    results = (REPO / "docs" / "results.md").read_text(encoding="utf-8")
    assert f"<!-- {plan.section}:start -->" in results and f"<!-- {plan.section}:end -->" in results


def test_the_real_text_learning_curve_is_three_budgets_of_three_configurations():
    """The plain fine-tune and the foldoc_en headline's two finalists (its screening round chose
    term-loss-normalized and term-loss-after-first), each at 300, 600 and 1200 steps."""
    plan = Plan.load(REPO / "realtext" / "curve_foldoc_en.yaml")
    headline = Plan.load(REPO / "realtext" / "headline_foldoc_en.yaml")
    assert plan.fixed and plan.final_split == "test"
    budgets: dict[str, list[int]] = {}
    for name in plan.configurations:
        remedy, steps = name.rsplit("-", 1)
        sets = [s for s in plan.overrides(name, {}) if not s.startswith("train.max_steps=")]
        assert sets == headline.overrides(remedy, {})
        max_steps = _params_of([*plan.common, *plan.overrides(name, {})]).train.max_steps
        assert str(max_steps) == steps
        budgets.setdefault(remedy, []).append(max_steps)
    remedies = ("finetune", "term-loss-normalized", "term-loss-after-first")
    assert budgets == dict.fromkeys(remedies, [300, 600, 1200])


def test_the_manpages_zh_curve_reruns_the_headline_confirm_runs_and_adds_the_term_loss():
    """manpages_zh's curve: its plain runs are the headline's confirm runs `finetune` and
    `finetune-longer` param for param (same seeds and split, so DVC's run cache restores them), and
    the term loss is the headline's `term-loss-normalized` at both budgets."""
    plan = Plan.load(REPO / "realtext" / "curve_manpages_zh.yaml")
    headline = Plan.load(REPO / "realtext" / "headline_manpages_zh.yaml")
    assert plan.fixed and (plan.final_seeds, plan.final_split) == (headline.final_seeds, headline.final_split)
    assert plan.common == headline.common and plan.baseline == "finetune-300"

    def params(p, name):
        return _params_of([*p.common, *p.overrides(name, {})])

    assert params(plan, "finetune-300") == params(headline, "finetune")
    assert params(plan, "finetune-570") == params(headline, "finetune-longer")
    for steps in (300, 570):
        sets = plan.overrides(f"term-loss-normalized-{steps}", {})
        assert [s for s in sets if not s.startswith("train.max_steps=")] == \
            headline.overrides("term-loss-normalized", {})
        assert params(plan, f"term-loss-normalized-{steps}").train.max_steps == steps
    results = (REPO / "docs" / "results.md").read_text(encoding="utf-8")
    assert f"<!-- {plan.section}:start -->" in results and f"<!-- {plan.section}:end -->" in results


def test_register_takes_the_final_winner_within_the_guard(monkeypatch, tmp_path):
    """`rarelm headline --register`: the final comparison's best term NLL/char among the configurations
    within the plan's guard (here `a`, best but +5% perplexity, is out) becomes a new version of the
    registered model, in a real store whose runs carry the experiments' names."""
    import mlflow
    from mlflow.entities import LoggedModelOutput

    (tmp_path / "plan.yaml").write_text("common: []\nscreen_seeds: []\nfinal_seeds: [4]\n"
                                        "configurations: {base: [], a: [alpha=1], b: [alpha=0.5]}\n")
    plan = Plan.load(tmp_path / "plan.yaml")
    (tmp_path / "params.yaml").write_text("tracking: {experiment: rarelm, registered_model: hl-win}\n")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("rarelm", artifact_location=str(tmp_path / "mlruns"))
    ids = {}
    for name in ("base", "a", "b"):
        mlrun = client.create_run(experiment, run_name=name, tags={"DVC_EXP_NAME": plan.experiment(name, 4)})
        model = client.create_logged_model(experiment, name="model", source_run_id=mlrun.info.run_id)
        client.log_outputs(mlrun.info.run_id, [LoggedModelOutput(model.model_id, 0)])
        ids[name] = mlrun.info.run_id
    nll, ppl = {"base": 1.3, "a": 1.1, "b": 1.2}, {"base": 2.0, "a": 2.1, "b": 2.02}
    report = {"metrics": ["nll_per_char"], "lower_is_better": ["nll_per_char"],
              "configurations": [{"label": n, "summary": {"ppl": ppl[n]},
                                  "runs": [{"name": plan.experiment(n, 4), "source": "git", "id": "c0ffee",
                                            "seed": "4", "experiment": plan.experiment(n, 4)}]} for n in nll],
              "rows": [{"configuration": n, "slice": "all", "aggregate": "occurrences",
                        "metric": "nll_per_char", "value": v} for n, v in nll.items()]}
    monkeypatch.setattr(hl, "run_batch", lambda repo, batch, log, poll, **kw: len(batch))
    monkeypatch.setattr(hl, "record", lambda repo, out, name: None)
    monkeypatch.setattr(hl, "_compare", lambda *args: report)
    monkeypatch.setattr(hl, "write_outputs", lambda result, out, page: None)
    monkeypatch.setattr(hl, "_log_sweep", lambda *args: None)
    logs: list[str] = []
    hl.headline(tmp_path, plan, tmp_path / "out", None, log=logs.append, register=True)
    assert logs[-1] == f"registered the winner b (run {ids['b']}) as models:/hl-win/1"
    version = client.get_model_version("hl-win", "1")
    assert version.run_id == ids["b"] and version.description.splitlines()[-1] == (
        "chosen: rarelm headline (headline, test split, seeds 4), best nll_per_char over all occurrences "
        "among 3 configurations, baseline included: b, seed 4 (run 1 of 1)")
    assert version.tags["experiment"] == "hl-b-s4" and not client.get_registered_model("hl-win").aliases


def test_rules_sentence_names_every_guard_and_the_tie_metric_the_plan_fixed():
    """The results page's rules line says what the plan ranked by: the general-text guard where
    the runs score general text, and the plan's tie metric (it said term-token accuracy always)."""
    from rarelm.report.headline_outputs import _rules

    plan = {"screen_split": "val", "screen_seeds": [1337], "final_split": "test",
            "final_seeds": [1, 2, 3], "finalists": 2, "ppl_tolerance": 0.02,
            "insertion_tolerance": 0.1, "insertion_metric": "false_insertion_start_mass",
            "general_tolerance": 0.03, "tie_metric": "completion_match",
            "common": ["eval.general_text=data/general/zh.txt"]}
    rules = _rules(plan)
    assert ("within 2% of the baseline's overall perplexity, 3% of its general-text perplexity "
            "and 10% (relative) of its term-start mass off terms") in rules
    assert "(then the completion given the term's first token)" in rules
    plain = _rules({**plan, "common": ['eval.general_text=""'], "tie_metric": "token_acc"})
    assert "general-text" not in plain and "(then term-token accuracy)" in plain


def test_the_model_alone_column_shows_only_where_a_configuration_mixes():
    """The per-run table's "general-text ppl, model alone" column: only where some configuration's
    figure differs from its ppl_general (kNN-LM or the cache mixed in)."""
    from rarelm.report.headline_outputs import run_table

    def report(mixed: float) -> dict:
        rows = [{"configuration": c, "metric": m, "value": v, "seeds": 1}
                for c, m, v in [("base", "ppl", 10.0), ("base", "ppl_general", 20.0),
                                ("base", "ppl_general_model", 20.0), ("cache", "ppl", 9.0),
                                ("cache", "ppl_general", mixed), ("cache", "ppl_general_model", 20.0)]]
        return {"configurations": [{"label": "base"}, {"label": "cache"}], "run_rows": rows}

    assert "model alone" in run_table(report(24.0)).splitlines()[0]
    assert "model alone" not in run_table(report(20.0)).splitlines()[0]
