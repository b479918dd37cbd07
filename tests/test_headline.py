"""The headline experiment's machinery on a real git + DVC repo, with stand-in stages.

The repo's `train` stage writes a "model" (its params) and counts its own runs; `evaluate` turns
it into the per-occurrence rows of tests/test_compare.py's generator, where a larger effective
alpha writes more terms. Real `dvc exp run --queue`, `dvc queue start`, run cache and
`rarelm.compare`; no model is trained, so the three rounds take seconds, not 90 minutes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rarelm import headline as hl
from rarelm.errors import RarelmError
from tests.conftest import run
from tests.test_compare import GENERATOR

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
rows = occurrence_rows(int(seed), effective)
with open("metrics/eval_occurrences.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\\n" for r in rows)
with open("metrics/eval.json", "w") as f:
    json.dump(summary(int(seed), effective), f)
"""
PLAN = {"common": [], "seeds": [1, 2], "finalists": 1, "combine": 2,  # one method: nothing to combine
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
    (root / "params.yaml").write_text(yaml.safe_dump({"seed": 1, "alpha": 0.0, "beta": 0.0, "tau": 0.0}))
    (root / "dvc.yaml").write_text(f"""stages:
  train:
    cmd: python train.py {trained}
    deps: [train.py]
    params: [seed, alpha, beta]
    outs: [model.txt]
  evaluate:
    cmd: python evaluate.py
    deps: [evaluate.py, model.txt]
    params: [tau]
    outs:
      - metrics/eval_occurrences.jsonl:
          cache: false
    metrics:
      - metrics/eval.json:
          cache: false
""")
    (root / "plan.yaml").write_text(yaml.safe_dump(PLAN))
    (root / "README.md").write_text(f"# demo\n\nbefore\n\n{hl.START}\nold table\n{hl.END}\n\nafter\n")
    (root / ".gitignore").write_text("/model.txt\n")
    run(["git", "add", "-A"], root, check=True)
    run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"], root, check=True)
    log: list[str] = []
    result = hl.headline(root, hl.Plan.load(root / "plan.yaml"), root / "reports", root / "README.md",
                         log=log.append, poll=1)
    return {"root": root, "result": result, "log": log, "trained": trained}


def test_the_rounds_run_the_plan(repo):
    root, result = repo["root"], repo["result"]
    names = {n for n in hl.existing(root) if n.startswith(hl.PREFIX)}
    assert names == {"hl-baseline-s1", "hl-good-s1", "hl-tuned-s1", "hl-baseline-s2", "hl-good-s2"}
    assert result["combination"] == [] and result["finalists"] == ["good"]
    assert [n for n, _ in result["ranking"]] == ["good", "tuned"]
    assert set(result["rounds_s"]) == {"screen", "replicate"}
    # the decode variant re-used the baseline's trained model: 4 trainings for 5 experiments
    trained = repo["trained"].read_text().splitlines()
    assert sorted(trained) == sorted(["1 0.0 0.0", "1 0.7 0.0", "2 0.0 0.0", "2 0.7 0.0"])


def test_the_combination_round_merges_the_best_two_and_replicates_the_best(monkeypatch, tmp_path):
    """The rounds' logic with the experiments faked (the DVC side is the test above)."""
    plan = hl.Plan(common=["train.max_steps=5"], seeds=[7, 8], finalists=2, combine=2,
                   configurations={"baseline": [], "a": ["loss.targets=terms", "loss.rare_weight=2"],
                                   "b": ["loss.rare_weight=4"], "c": ["alpha=1"]},
                   decode={"d": {"of": "c", "set": ["eval.logit_adjust_tau=0.5"]}})
    gains = {"a": 0.3, "b": 0.25, "c": 0.2, "d": 0.1, "combination": 0.5}
    batches: list[tuple[str, list]] = []
    monkeypatch.setattr(hl, "run_batch", lambda repo, batch, log, poll: batches.append(batch) or len(batch))
    monkeypatch.setattr(hl, "ranking", lambda repo, plan, names, seed: sorted(
        ((n, gains[n]) for n in names), key=lambda x: -x[1]))
    monkeypatch.setattr(hl, "_compare", lambda *args: {})
    monkeypatch.setattr(hl, "write_outputs", lambda *args: None)
    result = hl.headline(tmp_path, plan, tmp_path / "out", None, log=lambda m: None)
    screen, combine, replicate = batches
    assert [n for n, _ in screen] == ["hl-baseline-s7", "hl-a-s7", "hl-b-s7", "hl-c-s7", "hl-d-s7"]
    assert dict(screen)["hl-d-s7"] == ["train.max_steps=5", "seed=7", "alpha=1", "eval.logit_adjust_tau=0.5"]
    # a and c: b's loss.rare_weight clashes with a's
    assert combine == [("hl-combination-s7", ["train.max_steps=5", "seed=7", "loss.targets=terms",
                                              "loss.rare_weight=2", "alpha=1"])]
    assert result["finalists"] == ["combination", "a"]
    assert [n for n, _ in replicate] == ["hl-baseline-s8", "hl-combination-s8", "hl-a-s8"]
    assert set(result["rounds_s"]) == {"screen", "combine", "replicate"}


def test_reports_and_readme_table(repo):
    root, result = repo["root"], repo["result"]
    final = json.loads((root / "reports" / "final" / "report.json").read_text())
    assert [c["label"] for c in final["configurations"]] == ["baseline", "good"]
    assert [len(c["runs"]) for c in final["configurations"]] == [2, 2]
    screen = json.loads((root / "reports" / "screen" / "report.json").read_text())
    assert [c["label"] for c in screen["configurations"]] == ["baseline", "good", "tuned"]
    assert (root / "reports" / hl.FIGURE).read_text().startswith("<svg")
    readme = (root / "README.md").read_text()
    assert readme.startswith("# demo\n\nbefore\n\n") and readme.endswith("\n\nafter\n")
    assert "old table" not in readme and f"]({Path('reports') / hl.FIGURE})" in readme
    rows = [line for line in readme.splitlines() if line.startswith("| good |")]
    assert len(rows) == 2  # final and screening tables
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    row = hl._row(result["final"], "good", "all")
    assert cells[1] == "2" and cells[2] == f"{row['value']:.3f}"
    assert cells[3] == f"{row['diff']:+.3f} [{row['diff_lo']:+.3f}, {row['diff_hi']:+.3f}]"
    assert row["diff_lo"] > 0  # alpha 0.7 writes clearly more terms in the generator
    ppl = final["configurations"][1]["summary"]["ppl_frequent"]
    assert f"{ppl:.4f} (+" in rows[0]


def test_an_interrupted_headline_resumes_without_rerunning(repo):
    root = repo["root"]
    log: list[str] = []
    again = hl.headline(root, hl.Plan.load(root / "plan.yaml"), root / "reports", None,
                        log=log.append, poll=1)
    assert not any(line.startswith("queue") for line in log)
    assert again["finalists"] == repo["result"]["finalists"]
    assert again["rounds_s"] == repo["result"]["rounds_s"]  # the times measured when they ran
    assert len(repo["trained"].read_text().splitlines()) == 4


def test_bad_plans_are_one_line(tmp_path):
    cases = [("seeds: [1]\n", "not a headline plan"),
             ("seeds: []\nconfigurations: {baseline: []}\n", "needs seeds"),
             ("seeds: [1]\nconfigurations: {baseline: []}\ndecode: {x: {of: nope, set: [a=1]}}\n",
              "unknown configuration 'nope'"),
             (": [\n", "cannot read")]
    for text, message in cases:
        path = tmp_path / "plan.yaml"
        path.write_text(text)
        with pytest.raises(RarelmError, match=message):
            hl.Plan.load(path)


def test_ranking_leaves_out_configurations_that_cost_frequent_perplexity(monkeypatch):
    plan = hl.Plan(common=[], seeds=[1], configurations={"baseline": [], "a": ["x=1"], "b": ["y=1"],
                                                         "c": ["z=1"]}, decode={})
    summaries = {"baseline": 1.25, "a": 1.27, "b": 1.30, "c": 1.2749}  # +1.6%, +4%, +1.99%
    diffs = {"a": 0.1, "b": 0.3, "c": 0.2}
    report = {"configurations": [{"label": k, "summary": {"ppl_frequent": v}} for k, v in summaries.items()],
              "rows": [{"configuration": k, "slice": hl.RANK_SLICE, "aggregate": "occurrences",
                        "metric": "exact_match", "diff": v} for k, v in diffs.items()]}
    monkeypatch.setattr(hl, "_compare", lambda *args: report)
    assert hl.ranking(Path("."), plan, ["a", "b", "c"], 1) == [("c", 0.2), ("a", 0.1)]
