"""rarelm.tracking against a real MLflow store (SQLite in a temporary folder)."""

from __future__ import annotations

import json
import time

import pytest

from rarelm import tracking
from rarelm.params import Params


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """One SQLite store for the module (creating its tables takes seconds)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def test_store_defaults_to_the_repo_root(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    assert tracking.tracking_uri() == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    monkeypatch.setenv("DVC_ROOT", "/work/some/repo")  # inside a queued experiment's temp copy
    assert tracking.tracking_uri() == "sqlite:////work/some/repo/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")
    assert tracking.tracking_uri() == "http://mlflow.internal:5000"


def test_upstream_metrics_are_flattened_and_missing_or_broken_files_skipped(tmp_path):
    (tmp_path / "prepare.json").write_text(json.dumps(
        {"documents": 10, "language": "en", "train": {"documents": 8}}))
    (tmp_path / "weights.json").write_text("{not json")
    assert tracking.upstream_metrics(tmp_path, ["prepare", "tokenize", "weights"]) == {
        "prepare.documents": 10.0, "prepare.train.documents": 8.0}


def test_a_run_from_start_to_evaluate(store, monkeypatch, tmp_path):
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("DVC_EXP_NAME", "exp-alpha07")
    params = Params()
    run = tracking.start_run(params, stage="train")
    assert run.active
    run.log_metrics({"train/loss": 3.5}, step=10)
    run.log_metrics({"train/loss": 2.5}, step=20)
    run.save(tmp_path / "mlflow_run.json")
    run.finish()
    assert not run.active
    info = json.loads((tmp_path / "mlflow_run.json").read_text())
    assert info == {"run_id": run.run_id, "tracking_uri": store, "experiment": "rarelm"}

    again = tracking.open_run(tmp_path / "mlflow_run.json", stage="evaluate")
    again.log_metrics({"eval/ppl": 12.0})
    again.finish()
    client = mlflow.MlflowClient(store)
    mlrun = client.get_run(run.run_id)
    assert mlrun.info.status == "FINISHED" and mlrun.info.run_name == "exp-alpha07"
    assert mlrun.data.params == {k: (json.dumps(v) if isinstance(v, list) else str(v))
                                 for k, v in params.flat().items()}
    tags = mlrun.data.tags
    assert tags["DVC_EXP_NAME"] == "exp-alpha07"
    assert tags["stage"] == "train" and tags["stages"] == "train,evaluate"
    assert [m.value for m in client.get_metric_history(run.run_id, "train/loss")] == [3.5, 2.5]
    assert mlrun.data.metrics["eval/ppl"] == 12.0


def test_resuming_continues_the_run_or_starts_a_new_one_if_it_is_gone(store, monkeypatch):
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    params = Params()
    first = tracking.start_run(params, stage="train")
    first.finish("FAILED")  # a crashed attempt
    resumed = tracking.start_run(params, stage="train", run_id=first.run_id)
    assert resumed.run_id == first.run_id
    assert mlflow.MlflowClient(store).get_run(first.run_id).info.status == "RUNNING"
    resumed.finish()
    fresh = tracking.start_run(params, stage="train", run_id="0" * 32)  # not in this store
    assert fresh.active and fresh.run_id != "0" * 32
    fresh.finish()


def test_unreachable_store_is_one_warning_and_an_inert_run(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # nothing listens there
    t0 = time.monotonic()
    run = tracking.start_run(Params(), stage="train")
    assert time.monotonic() - t0 < 30  # bounded retries and timeouts
    run.log_metrics({"train/loss": 1.0}, step=1)
    run.set_tags({"x": "y"})
    run.save(tmp_path / "mlflow_run.json")
    run.finish("FAILED")
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("rarelm train: warning: MLflow tracking store http://127.0.0.1:9 ")
    assert not run.active and not (tmp_path / "mlflow_run.json").exists()
    assert not tracking.open_run(tmp_path / "mlflow_run.json", stage="evaluate").active
