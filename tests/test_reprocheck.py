"""rarelm.report.reprocheck: the reproducibility checks that CI (.github/workflows/ci.yml) runs.

The checker is tested here on toy DAGs; its run on the real DAG (tiny params, train.nproc = 2)
is tests/test_reliability.py::test_dag_twice_from_scratch_gives_byte_identical_outputs.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from rarelm.report import reprocheck
from tests.conftest import BIN, run


def toy_repo(root: Path, stages: dict, params: dict | None = None) -> Path:
    """A git + DVC repo holding only the given stages (fast checks of the checker itself)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}, sort_keys=False))
    (root / "params.yaml").write_text(yaml.safe_dump(params or {"x": 1.0}))
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"]):
        run(cmd, root, check=True)
    return root


def test_reproduce_names_the_output_that_differs_and_forgives_wall_clock(tmp_path):
    timing = ("import json, time; json.dump({'loss': 1.5, 'tokens_per_s': time.time(),"
              " 'wall_seconds': time.time()}, open('metrics/train.json', 'w'))")
    stages = {"noise": {"cmd": "python -c \"import os; open('noise.bin', 'wb').write(os.urandom(8))\"",
                        "outs": ["noise.bin"]},
              "steady": {"cmd": "python -c \"open('steady.txt', 'w').write('same')\"",
                         "outs": ["steady.txt"]},
              "train": {"cmd": f"mkdir -p metrics && python -c \"{timing}\"",
                        "metrics": [{"metrics/train.json": {"cache": False}}]},
              "model": {"cmd": "mkdir -p models/m && echo w > models/m/w.bin && "
                               "python -c \"import uuid; print(uuid.uuid4())\" > models/m/mlflow_run.json",
                        "outs": ["models/m"]}}
    root = toy_repo(tmp_path / "toy", stages)
    log: list[str] = []
    with pytest.raises(reprocheck.ReproError, match=r"noise\.bin") as err:
        reprocheck.reproduce(root, runs=2, log=log.append)
    assert all(p not in str(err.value) for p in ("steady.txt", "metrics/train.json", "models/m"))
    assert "reprocheck: metrics/train.json: differs only in wall-clock fields" in log
    assert "reprocheck: models/m: differs only in mlflow_run.json (the run's identity)" in log


def test_metrics_against_a_reference_folder_with_tolerance_and_summary(tmp_path):
    code = ("import json, time; json.dump({'ppl': 10.0, 'acc': 0.5, 'time_s': time.time()},"
            " open('metrics/eval.json', 'w'))")
    stages = {"evaluate": {"cmd": f"mkdir -p metrics && python -c \"{code}\"",
                           "metrics": [{"metrics/eval.json": {"cache": False}}]}}
    root = toy_repo(tmp_path / "toy", stages)
    head = run(["git", "rev-parse", "HEAD"], root).stdout

    def workspace(ppl: float) -> None:
        (root / "metrics").mkdir(exist_ok=True)
        (root / "metrics/eval.json").write_text(json.dumps({"ppl": ppl, "acc": 0.5, "time_s": 1.0}))

    workspace(10.0)  # what a run of the stage writes; saved as the reference
    reprocheck.save_metrics(root, ".ci/reference")
    assert json.loads((root / ".ci/reference/metrics/eval.json").read_text())["ppl"] == 10.0

    workspace(10.3)  # 3 % off: inside 0.01 + 5 %
    summary = tmp_path / "summary.md"
    rows = reprocheck.compare_metrics(root, ".ci/reference", summary=summary, log=lambda _: None)
    verdicts = {r[1]: r[5] for r in rows}
    assert verdicts == {"ppl": "ok", "acc": "ok", "time_s": "wall clock, not compared"}
    assert "| metrics/eval.json | ppl | 10 | 10.3 | +0.3 | ok |" in summary.read_text()
    workspace(11.0)  # 10 % off
    with pytest.raises(reprocheck.ReproError, match=r"metrics/eval.json:ppl 10.0 -> 11.0"):
        reprocheck.compare_metrics(root, ".ci/reference", log=lambda _: None)
    # the throw-away reference commit moved no branch and left the index alone
    assert run(["git", "rev-parse", "HEAD"], root).stdout == head
    assert run(["git", "diff", "--cached", "--name-only"], root).stdout == ""
    assert not (root / ".git/reprocheck-index").exists()


def test_reference_under_auto_precision_warns_and_another_precision_is_named(tmp_path):
    """A reference saved with train.precision auto holds on one CPU kind only: a warning; a run
    in another precision than the reference's fails on `precision`, with the way out."""
    code = ("import json, yaml; p = yaml.safe_load(open('params.yaml'))['train']['precision'];"
            " json.dump({'val_ce': 2.0, 'precision': 'bf16' if p == 'auto' else p},"
            " open('metrics/train.json', 'w'))")
    stages = {"train": {"cmd": f"mkdir -p metrics && python -c \"{code}\"",
                        "params": ["train.precision"],
                        "metrics": [{"metrics/train.json": {"cache": False}}]}}
    root = toy_repo(tmp_path / "toy", stages, params={"train": {"precision": "auto"}})
    log: list[str] = []
    reprocheck.reproduce(root, runs=1, save_reference=".ci/reference", log=log.append)
    assert f"reprocheck: warning: {reprocheck.PRECISION_HINT}" in log
    (root / "params.yaml").write_text("train:\n  precision: fp32\n")
    log.clear()
    reprocheck.reproduce(root, runs=1, log=log.append)
    assert not any("warning" in line for line in log)
    with pytest.raises(reprocheck.ReproError, match=r"precision bf16 -> fp32 \(DIFFERS\).*pin "
                                                     r"train.precision"):
        reprocheck.compare_metrics(root, ".ci/reference", log=lambda _: None)


def test_cli_overlay_params_unknown_key_is_an_error(tmp_path):
    root = tmp_path
    (root / "params.yaml").write_text("train:\n  nproc: 2\n")
    (tmp_path / "ci.yaml").write_text("train:\n  nproc: 1\n")
    reprocheck.apply_params(root, tmp_path / "ci.yaml")
    assert yaml.safe_load((root / "params.yaml").read_text()) == {"train": {"nproc": 1}}
    (tmp_path / "bad.yaml").write_text("train:\n  nprocs: 1\n")
    with pytest.raises(reprocheck.ReproError, match="unknown param train.nprocs"):
        reprocheck.apply_params(root, tmp_path / "bad.yaml")


def test_ci_params_overlay_fits_the_real_params():
    """.ci/params.yaml only names keys that params.yaml has, with values params.py accepts."""
    from rarelm.params import Params

    root = Path(__file__).resolve().parents[1]
    params = yaml.safe_load((root / "params.yaml").read_text())
    overlay = yaml.safe_load((root / ".ci/params.yaml").read_text())

    def merge(base, new, prefix=""):
        for key, value in new.items():
            assert key in base, f".ci/params.yaml: unknown key {prefix}{key}"
            if isinstance(value, dict):
                merge(base[key], value, f"{prefix}{key}.")
            else:
                base[key] = value

    merge(params, overlay)
    Params.from_dict(params)
    # not `auto`, which is bf16 on some CPUs and fp32 on others: the reference holds on both
    assert overlay["train"]["precision"] in ("fp32", "bf16")
    reference = json.loads((root / ".ci/reference/metrics/train.json").read_text())
    assert reference["precision"] == overlay["train"]["precision"]


def test_workflow_runs_tests_dag_reproducibility_and_metrics_diff():
    root = Path(__file__).resolve().parents[1]
    workflow = yaml.safe_load((root / ".github/workflows/ci.yml").read_text())
    assert workflow[True] if True in workflow else workflow["on"]  # `on:` parses as True in YAML 1.1
    steps = [s for job in workflow["jobs"].values() for s in job["steps"]]
    commands = "\n".join(s.get("run", "") for s in steps)
    uses = [s.get("uses", "") for s in steps]
    assert any(u.startswith("actions/checkout@") for u in uses)
    assert any(u.startswith("actions/setup-python@") for u in uses)
    order = [commands.index(c) for c in ("make test", "reprocheck reproduce --params .ci/params.yaml",
                                         "reprocheck metrics --reference .ci/reference")]
    assert order == sorted(order)
    assert "GITHUB_STEP_SUMMARY" in commands
    assert "--runs 2" in commands
    assert (root / ".ci/reference/metrics").is_dir()
    # the helper the workflow calls is the one tested here
    result = subprocess.run([str(BIN / "python"), "-m", "rarelm.report.reprocheck", "--help"], cwd=root,
                            capture_output=True, text=True)
    assert result.returncode == 0 and "reproduce" in result.stdout and "metrics" in result.stdout


def test_json_outputs_that_are_no_dvc_metrics_are_checked_as_metrics(tmp_path):
    """dvc.yaml declares only metrics/summary.json as `metrics:` (so that `dvc exp show` fits);
    metrics/train.json, a cached output, is still compared by content, wall clock aside, and
    against the reference (`dvc metrics diff --targets`)."""
    code = ("import json, time; json.dump({'loss': 1.5, 'precision': 'fp32', 'tokens_per_s': time.time()},"
            " open('metrics/train.json', 'w')); json.dump({'ppl': 4.0}, open('metrics/summary.json', 'w'))")
    stages = {"train": {"cmd": f"mkdir -p metrics && python -c \"{code}\"",
                        "outs": ["metrics/train.json"],
                        "metrics": [{"metrics/summary.json": {"cache": False}}]}}
    root = toy_repo(tmp_path / "toy", stages)
    assert reprocheck.metrics_files(root) == ["metrics/summary.json", "metrics/train.json"]
    log: list[str] = []
    reprocheck.reproduce(root, runs=2, save_reference=".ci/reference", log=log.append)
    assert "reprocheck: metrics/train.json: differs only in wall-clock fields" in log
    assert json.loads((root / ".ci/reference/metrics/train.json").read_text())["loss"] == 1.5
    rows = reprocheck.compare_metrics(root, ".ci/reference", log=lambda _: None)
    assert {(r[0], r[1]): r[5] for r in rows} == {
        ("metrics/summary.json", "ppl"): "ok", ("metrics/train.json", "loss"): "ok",
        ("metrics/train.json", "precision"): "ok",
        ("metrics/train.json", "tokens_per_s"): "wall clock, not compared"}
    reference = json.loads((root / ".ci/reference/metrics/train.json").read_text())
    (root / ".ci/reference/metrics/train.json").write_text(json.dumps({**reference, "loss": 2.0}))
    with pytest.raises(reprocheck.ReproError, match=r"metrics/train.json:loss 2.0 -> 1.5"):
        reprocheck.compare_metrics(root, ".ci/reference", log=lambda _: None)
