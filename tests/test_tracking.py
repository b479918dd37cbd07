"""rarelm.tracking against a real MLflow store (SQLite in a temporary folder)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rarelm.errors import RarelmError
from rarelm.params import Params, TrackingParams
from rarelm.tracking import export, model_log, ui
from rarelm.tracking.datasets import dvc_hashes
from rarelm.tracking.experiment import EXPERIMENT_NOTE, experiment_id
from rarelm.tracking.metrics import upstream_metrics
from rarelm.tracking.naming import git_commit
from rarelm.tracking.run import check_tensorboard, open_run, start_run
from rarelm.tracking.store import prepare_store
from rarelm.tracking.sweep import log_sweep
from rarelm.tracking.uri import logs_text, tracking_uri
from tests.conftest import REPO

FAMILIES = ("summary/", "train/", "val/", "system/")


@pytest.fixture(scope="module")
def blank_store(tmp_path_factory) -> Path:
    """An empty, fully migrated store file made once: creating one costs MLflow seconds of
    migrations, copying it none."""
    import mlflow

    db = tmp_path_factory.mktemp("blank") / "mlflow.db"
    mlflow.MlflowClient(f"sqlite:///{db}").search_experiments()
    return db


@pytest.fixture(scope="module")
def store(blank_store, tmp_path_factory) -> str:
    """One SQLite store for the module's runs."""
    db = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    shutil.copy(blank_store, db)
    return f"sqlite:///{db}"


@pytest.fixture
def workspace(tmp_path, monkeypatch) -> Path:
    """A git repo with one commit, DVC-tracked data as dvc.lock records it, as the current folder."""
    (tmp_path / "data/tokenized").mkdir(parents=True)
    (tmp_path / "data/tokenized/train.tokens").write_bytes(b"\0" * 40)
    (tmp_path / "data/tokenized/meta.json").write_text("{}")
    (tmp_path / "data/weights").mkdir()
    (tmp_path / "data/weights/weights.npy").write_bytes(b"\1" * 24)
    (tmp_path / "data/prepared").mkdir()
    (tmp_path / "data/prepared/test.jsonl").write_text("{}\n")
    (tmp_path / "data/rare").mkdir()
    (tmp_path / "data/rare/terms.jsonl").write_text("changed since dvc.lock\n")
    outs = {"prepare": [("data/prepared", "d" * 32 + ".dir", 3, 1)],
            "tokenize": [("data/tokenized", "a" * 32 + ".dir", 42, 2)],
            "weights": [("data/weights", "b" * 32 + ".dir", 24, 1)],
            "rare_terms": [("data/rare", "c" * 32 + ".dir", 999, 1)]}  # stale: not its hash
    lock = {"schema": "2.0", "stages": {stage: {"cmd": "python -m stages." + stage, "outs": [
        {"path": path, "hash": "md5", "md5": md5, "size": size, "nfiles": n}
        for path, md5, size, n in entries]} for stage, entries in outs.items()}}
    (tmp_path / "dvc.lock").write_text(json.dumps(lock))  # JSON is YAML
    for cmd in (["git", "init", "-q"], ["git", "add", "dvc.lock"],
                ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"]):
        subprocess.run(cmd, cwd=tmp_path, check=True, capture_output=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    monkeypatch.delenv("DVC_EXP_BASELINE_REV", raising=False)
    return tmp_path


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A 1-layer GPT-2 and its byte-level BPE tokenizer, saved as the train stage saves them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("model") / "model"
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(["The patient has atypical encephaloectasia."] * 20, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")
    tokenizer.save_pretrained(folder)
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=16, n_layer=1, n_head=2,
                        bos_token_id=0, eos_token_id=0)
    GPT2LMHeadModel(config).save_pretrained(folder)
    export.complete(folder, export.model_card(Params(), {"parameters": 1, "val_ce": 2.5}, {}))
    return folder


def test_store_defaults_to_the_repo_root(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    assert tracking_uri() == f"sqlite:///{tmp_path.resolve()}/mlflow.db"
    monkeypatch.setenv("DVC_ROOT", "/work/some/repo")  # inside a queued experiment's temp copy
    assert tracking_uri() == "sqlite:////work/some/repo/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")
    assert tracking_uri() == "http://mlflow.internal:5000"


def test_upstream_metrics_are_flattened_and_missing_or_broken_files_skipped(tmp_path):
    (tmp_path / "prepare.json").write_text(json.dumps(
        {"documents": 10, "language": "en", "train": {"documents": 8}}))
    (tmp_path / "weights.json").write_text("{not json")
    assert upstream_metrics(tmp_path, ["prepare", "tokenize", "weights"]) == {
        "upstream/prepare/documents": 10.0, "upstream/prepare/train/documents": 8.0}


def test_one_prefix_per_metric_family():
    source = "".join(p.read_text() for p in sorted((REPO / "rarelm").rglob("*.py")))  # wherever train logs
    assert 'f"train.{k}"' not in source  # metrics/train.json: the artifact final/train.json
    assert 'f"train/{k}"' in source and 'f"val/{k[4:]}"' in source  # the step curves


def test_only_the_summary_and_the_curves_are_mlflow_metrics(store, workspace, monkeypatch):
    """What evaluate and train log as MLflow metrics: the summary/ family and the step curves;
    eval.json and train.json are artifacts (the Model metrics tab opens on summary/)."""
    import mlflow

    from rarelm.evaluate.mlflow_log import log_eval_files, log_eval_metrics
    from rarelm.tracking.metrics import measured, summary_metrics

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    run = start_run(Params(tracking=TrackingParams(system_metrics=False)), stage="train")
    run.log_metrics({"train/loss": 3.5, "val/ce": 3.9}, step=10)
    train = {"steps": 10, "tokens": 640, "loss": 3.5, "val_ppl": 49.4, "tokens_per_s": 812.5,
             "parameters": 512}
    run.log_metrics(measured({f"final/{k}": v for k, v in train.items()}) | summary_metrics(train), step=10)
    evaluation = {"ppl": 12.5, "ppl_frequent": 3.25, "ppl_rare": 80.0, "term_exact_match": 0.5,
                  "term_exact_match_le15": 0.25, "term_nll_per_char": 1.5, "term_token_acc": 0.625,
                  "false_insertion_rate": 0.75, "em50_train_count": 24.0, "n_eval_terms": 8,
                  "rare_token_acc": 0.125, "logit_adjust_tau": 0.0, "val": {"ppl": 13.0},
                  "ppl_general": 90.0, "ppl_general_model": 90.0, "ppl_general_outside": 400.0,
                  "n_general_outside_tokens": 1000}
    log_eval_metrics(run, evaluation, inputs=[])
    (workspace / "eval.json").write_text(json.dumps(evaluation))
    log_eval_files(run, [workspace / "eval.json"], log_text=False)
    mlrun = mlflow.MlflowClient(store).get_run(run.run_id)
    assert mlrun.data.metrics == {
        "train/loss": 3.5, "val/ce": 3.9, "summary/tokens_per_s": 812.5, "summary/ppl": 12.5,
        "summary/ppl_frequent": 3.25, "summary/term_exact_match": 0.5, "summary/term_exact_match_le15": 0.25,
        "summary/term_nll_per_char": 1.5, "summary/term_token_acc": 0.625, "summary/false_insertion": 0.75,
        "summary/em50_train_count": 24.0, "summary/ppl_general": 90.0, "summary/ppl_general_outside": 400.0}
    logged = mlflow.MlflowClient(store).download_artifacts(run.run_id, "eval/eval.json", str(workspace / "a"))
    assert json.loads(Path(logged).read_text())["val"] == {"ppl": 13.0}  # every other figure: the artifact


def test_a_run_from_start_to_evaluate(store, monkeypatch, tmp_path):
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("DVC_EXP_NAME", "exp-alpha07")
    params = Params()
    run = start_run(params, stage="train")
    assert run.active
    run.log_metrics({"train/loss": 3.5}, step=10)
    run.log_metrics({"train/loss": 2.5}, step=20)
    run.save(tmp_path / "mlflow_run.json")
    run.finish()
    assert not run.active
    info = json.loads((tmp_path / "mlflow_run.json").read_text())
    assert info == {"run_id": run.run_id, "tracking_uri": store, "experiment": "rarelm"}

    again = open_run(tmp_path / "mlflow_run.json", "evaluate", params)
    assert again.run_id == run.run_id
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
    first = start_run(params, stage="train")
    first.finish("FAILED")  # a crashed attempt
    resumed = start_run(params, stage="train", run_id=first.run_id)
    assert resumed.run_id == first.run_id
    assert mlflow.MlflowClient(store).get_run(first.run_id).info.status == "RUNNING"
    resumed.finish()
    fresh = start_run(params, stage="train", run_id="0" * 32)  # not in this store
    assert fresh.active and fresh.run_id != "0" * 32
    fresh.finish()


def test_a_resumed_run_logs_each_step_once(store, monkeypatch):
    """Issue 56: after a resume, step 16 was logged twice to MLflow. The training resumes at its last
    checkpoint (step 15 here) and repeats the curve rows after it; the resumed run now logs no
    metric at a step it already holds (the first values stay), and every later step as before."""
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    params = Params(tracking=TrackingParams(system_metrics=False))
    first = start_run(params, stage="train")
    for step in (4, 8, 12, 16):
        first.log_metrics({"train/loss": 10.0 - step / 4, "train/tokens_per_s": 1000.0}, step=step)
    # killed: the run stays RUNNING, the last checkpoint is at step 15
    resumed = start_run(params, stage="train", run_id=first.run_id)
    for step in (16, 20):
        resumed.log_metrics({"train/loss": 10.0 - step / 4, "train/tokens_per_s": 2000.0}, step=step)
    resumed.log_metrics({"summary/loss": 5.0}, step=20)
    resumed.finish()
    client = mlflow.MlflowClient(store)
    history = {key: [(m.step, m.value) for m in sorted(client.get_metric_history(first.run_id, key),
                                                       key=lambda m: m.step)]
               for key in ("train/loss", "train/tokens_per_s", "summary/loss")}
    assert history == {"train/loss": [(4, 9.0), (8, 8.0), (12, 7.0), (16, 6.0), (20, 5.0)],
                       "train/tokens_per_s": [(4, 1000.0), (8, 1000.0), (12, 1000.0), (16, 1000.0),
                                              (20, 2000.0)],
                       "summary/loss": [(20, 5.0)]}


def test_unreachable_store_is_one_warning_and_an_inert_run(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # nothing listens there
    t0 = time.monotonic()
    params = Params(tracking=TrackingParams(required=False))
    run = start_run(params, stage="train")
    assert time.monotonic() - t0 < 30  # bounded retries and timeouts
    run.log_metrics({"train/loss": 1.0}, step=1)
    run.set_tags({"x": "y"})
    run.log_datasets(["data/tokenized"], "training")
    run.log_table([{"term": "x"}], "eval/term_samples.json")
    assert run.log_model(tmp_path, TrackingParams()) is None
    run.save(tmp_path / "mlflow_run.json")
    run.finish("FAILED")
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("rarelm train: warning: MLflow tracking store http://127.0.0.1:9 ")
    assert not run.active and not (tmp_path / "mlflow_run.json").exists()
    assert not open_run(tmp_path / "mlflow_run.json", "evaluate", params).active


def test_a_run_that_lost_its_store_midway_still_ends(blank_store, tmp_path, monkeypatch, capsys):
    """A SQLite store locked past its timeout (a loaded machine) turns the run inert with one warning
    line; finish() still ends it, through a fresh client, instead of leaving it RUNNING."""
    import contextlib
    import sqlite3

    import mlflow

    db = tmp_path / "mlflow.db"
    shutil.copy(blank_store, db)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    run = start_run(Params(tracking=TrackingParams(required=False)), stage="train")
    with contextlib.closing(sqlite3.connect(db, isolation_level=None)) as other:
        other.execute("BEGIN EXCLUSIVE")  # another writer holds the file
        run.log_metrics({"train/loss": 1.0}, step=1)  # waits out MLflow's 20 s busy timeout, fails
        other.execute("ROLLBACK")
    assert not run.active
    run.finish("FAILED")
    run.finish("FINISHED")  # a second finish changes nothing
    assert mlflow.MlflowClient(f"sqlite:///{db}").get_run(run.run_id).info.status == "FAILED"
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "is not reachable (sqlite3.OperationalError: database is locked" in line, line


def test_a_sigterm_during_a_metrics_write_ends_the_run_failed_and_the_store_unlocked(
        blank_store, tmp_path, monkeypatch):
    """A stage ends on SIGTERM through SystemExit (rarelm.process.exit_on_sigterm). Raised inside
    an MLflow write, it left the SQLite transaction open: the store stayed locked (1 trial in 3)
    and the FAILED status after it waited on the lock in vain. Now the write ends first."""
    import signal
    import sqlite3
    import threading

    import mlflow

    from rarelm.process import exit_on_sigterm

    previous = signal.signal(signal.SIGTERM, exit_on_sigterm)
    try:
        for trial in range(8):  # the signal lands at a different point of a write each time
            db = tmp_path / f"mlflow-{trial}.db"
            shutil.copy(blank_store, db)
            monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
            run = start_run(Params(tracking=TrackingParams(system_metrics=False)), stage="train")
            signal.signal(signal.SIGTERM, exit_on_sigterm)  # the handler turns itself off once used
            step = 1  # one write done before the timer starts: a slow disk cannot make it the first
            run.log_metrics({f"train/m{i}": float(step) for i in range(20)}, step=step)
            threading.Timer(0.3 + 0.05 * trial, os.kill, (os.getpid(), signal.SIGTERM)).start()
            with pytest.raises(SystemExit) as stop:
                while step < 10_000:
                    step += 1
                    run.log_metrics({f"train/m{i}": float(step) for i in range(20)}, step=step)
            assert stop.value.code == 143 and step > 1
            con = sqlite3.connect(db, timeout=0.5, isolation_level=None)
            con.execute("BEGIN IMMEDIATE")  # "database is locked" if the write was cut
            con.execute("ROLLBACK")
            con.close()
            run.finish("FAILED")
            assert mlflow.MlflowClient(f"sqlite:///{db}").get_run(run.run_id).info.status == "FAILED"
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_evaluation_of_a_model_from_another_experiment_gets_its_own_run(store, workspace,
                                                                         monkeypatch):
    """`dvc exp run -S eval.logit_adjust_tau=0.5` restores another experiment's trained model from
    DVC's run cache: its evaluation must not overwrite that experiment's run."""
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.setenv("DVC_EXP_NAME", "base-s1")
    trained = start_run(Params(), stage="train")
    trained.save(workspace / "mlflow_run.json")
    trained.finish()
    monkeypatch.setenv("DVC_EXP_NAME", "tau05-s1")
    run = open_run(workspace / "mlflow_run.json", "evaluate",
                            Params.from_dict({"eval": {"logit_adjust_tau": 0.5}}))
    assert run.active and run.run_id != trained.run_id
    run.log_metrics({"eval/ppl": 2.0})
    run.finish()
    client = mlflow.MlflowClient(store)
    mlrun = client.get_run(run.run_id)
    assert mlrun.info.run_name == "tau05-s1" and mlrun.data.params["eval.logit_adjust_tau"] == "0.5"
    assert mlrun.data.tags["rarelm.model_run_id"] == trained.run_id
    assert "eval/ppl" not in client.get_run(trained.run_id).data.metrics
    monkeypatch.setenv("DVC_EXP_NAME", "base-s1")  # the experiment that trained it: the same run
    same = open_run(workspace / "mlflow_run.json", "evaluate", Params())
    same.finish()
    assert same.run_id == trained.run_id


def test_experiment_kind_run_name_and_source_tags(store, workspace, monkeypatch):
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    params = Params(tracking=TrackingParams(experiment="kinds"))
    commit = git_commit()
    run = start_run(params, stage="train")  # as under `dvc repro`
    run.finish()
    client = mlflow.MlflowClient(store)
    mlrun = client.get_run(run.run_id)
    assert mlrun.info.run_name == f"train-{commit[:7]}-demo_en-gpt2-4x128"  # corpus and model: defaults
    tags = mlrun.data.tags
    assert tags["mlflow.source.git.commit"] == tags["git_commit"] == commit
    assert tags["mlflow.source.name"] == "stages/train.py" and tags["mlflow.source.type"] == "LOCAL"
    assert tags["mlflow.source.git.branch"] == subprocess.run(
        ["git", "branch", "--show-current"], capture_output=True, text=True).stdout.strip()
    assert "DVC_EXP_NAME" not in tags and "mlflow.source.git.repoURL" not in tags  # no remote
    experiment = client.get_experiment(mlrun.info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert experiment.tags["mlflow.note.content"] == EXPERIMENT_NOTE  # its description
    assert tags["mlflow.note.content"].startswith(
        f"train-{commit[:7]}-demo_en-gpt2-4x128 at commit {commit[:7]}; corpus data/raw/demo_en.txt.gz (en); "
        "model: GPT-2-style, 4 layers x 128, from scratch; alpha 0, ")

    client.delete_experiment_tag(experiment.experiment_id, "mlflow.experimentKind")  # an older store
    monkeypatch.setenv("DVC_EXP_NAME", "lumpy-gaur")  # as under `dvc exp run`
    monkeypatch.setenv("DVC_EXP_BASELINE_REV", "f" * 40)
    run = start_run(params, stage="train")
    run.finish()
    mlrun = client.get_run(run.run_id)
    assert mlrun.info.run_name == mlrun.data.tags["DVC_EXP_NAME"] == "lumpy-gaur"  # as `dvc exp show`
    assert mlrun.data.tags["mlflow.source.git.commit"] == mlrun.data.tags["DVC_EXP_BASELINE_REV"]
    note = mlrun.data.tags["mlflow.note.content"]
    assert note.startswith("DVC experiment lumpy-gaur at commit fffffff; corpus data/raw/demo_en.txt.gz")
    assert "changed from" not in note  # no such commit here: no comparison
    assert client.get_experiment(experiment.experiment_id).tags["mlflow.experimentKind"] == \
        "custom_model_development"
    assert experiment_id(store, "kinds") == experiment.experiment_id
    assert ui.ui_url(experiment.experiment_id).endswith(
        f"/#/experiments/{experiment.experiment_id}?workflowType=machine_learning")


def test_ui_url_command_without_a_store_links_the_experiments_and_creates_none(tmp_path, capsys):
    assert ui.main(["ui-url", f"sqlite:///{tmp_path / 'none.db'}"]) == 0
    out = capsys.readouterr().out
    assert out == f"MLflow runs: {ui.UI}/#/experiments?workflowType=machine_learning\n"
    assert not (tmp_path / "none.db").exists()
    assert ui.main(["nonsense"]) == 2


def test_data_inputs_carry_dvc_hashes_as_digests(store, workspace, monkeypatch):
    import mlflow

    from rarelm.evaluate.mlflow_log import log_eval_files, log_eval_metrics

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    assert dvc_hashes(["data/tokenized", workspace / "data/weights", "data/rare", "nope"]) == {
        "data/tokenized": "a" * 32 + ".dir", "data/weights": "b" * 32 + ".dir"}  # data/rare is stale
    run = start_run(Params(), stage="train", background=True,
                             inputs=[Path("data/tokenized"), Path("data/weights"), Path("data/rare")])
    run.save(workspace / "mlflow_run.json")
    run.finish()
    occurrences = workspace / "eval_occurrences.jsonl"
    rows = [{"term": "atypical encephaloectasia", "expected": " atypical encephaloectasia",
             "output": " start heparin", "exact_match": False, "nll": 2.5},
            {"term": "bilateral pyelomyositis", "expected": " bilateral pyelomyositis",
             "output": " bilateral pyelomyositis", "exact_match": True, "nll": 0.5}]
    occurrences.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for _ in range(2):  # evaluate twice into the run: the table is replaced, not appended to
        again = open_run(workspace / "mlflow_run.json", "evaluate", Params())
        log_eval_metrics(again, {"ppl": 3.0}, inputs=["data/prepared", "data/tokenized"])
        log_eval_files(again, [occurrences], log_text=True)
        assert again.run_id == run.run_id
    client = mlflow.MlflowClient(store)
    mlrun = client.get_run(run.run_id)
    inputs = {(d.dataset.name, d.dataset.digest, d.dataset.source_type,
               {t.key: t.value for t in d.tags}["mlflow.data.context"])
              for d in mlrun.inputs.dataset_inputs}
    assert inputs == {("data/tokenized", "a" * 32 + ".dir", "local", "training"),
                      ("data/weights", "b" * 32 + ".dir", "local", "training"),
                      ("data/prepared", "d" * 32 + ".dir", "local", "evaluation")}  # listed once
    table = client.load_table(mlrun.info.experiment_id, "eval/term_samples.json", run_ids=[run.run_id])
    assert table.to_dict("records") == rows
    assert {"path": "eval/term_samples.json", "type": "table"} in json.loads(
        mlrun.data.tags["mlflow.loggedArtifacts"])
    assert all(key.startswith(FAMILIES) for key in mlrun.data.metrics), mlrun.data.metrics


def test_logged_model_serves_any_prompt_through_pyfunc(store, tiny_model, monkeypatch, capsys, caplog):
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    params = Params(tracking=TrackingParams(experiment="models", registered_model="rarelm-test",
                                            system_metrics=False))
    run = start_run(params, stage="train")
    uri = run.log_model(tiny_model, params.tracking)
    run.finish()
    err = capsys.readouterr().err.strip().splitlines()
    assert uri.startswith("models:/m-") and len(err) == 1, err  # logged, not registered (register: false)
    assert err[0].startswith(f"rarelm train: model logged to MLflow as {uri} (")
    client = mlflow.MlflowClient(store)
    assert client.search_model_versions("name = 'rarelm-test'") == []
    (output,) = client.get_run(run.run_id).outputs.model_outputs  # the runs table's Models column
    assert uri == f"models:/{output.model_id}"
    # filed under the run's experiment (the UI's Models column), not under Default
    assert client.get_logged_model(output.model_id).experiment_id == \
        client.get_run(run.run_id).info.experiment_id != "0"
    info = mlflow.models.get_model_info(uri)
    assert info.saved_input_example_info is not None  # the UI shows it; MLflow checked it at logging
    assert {p.name: p.default for p in info.signature.params.params} == model_log.SERVING_DEFAULTS
    folder = Path(mlflow.artifacts.download_artifacts(uri)) / "artifacts/model"
    assert (folder / "README.md").read_text() == (tiny_model / "README.md").read_text()  # the model card

    caplog.set_level("WARNING")
    model = mlflow.pyfunc.load_model(uri)  # MLflow's own scoring path, as `mlflow models serve` uses
    greedy = {"max_new_tokens": 4, "do_sample": False}
    out = model.predict(["The patient has"], params=greedy)
    assert len(out) == 1 and out[0].startswith("The patient has") and len(out[0]) > len("The patient has")
    assert model.predict(["The patient has"], params=greedy) == out  # greedy: repeatable
    sampled = model.predict(["The patient has", "The"])  # the defaults: sampling, seed 0
    assert model.predict(["The patient has", "The"]) == sampled and len(sampled) == 2
    assert caplog.records == []  # no per-request warning (params override the saved config, ...)
    long = "The patient has atypical encephaloectasia. " * 20  # more tokens than the 64 positions
    (answer,) = model.predict([long], params=greedy)
    assert answer.startswith(long) and len(answer) > len(long)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.endswith("exceeds the model's context of 64 tokens: keeping the prompt's last 60 tokens")
    assert torch.is_grad_enabled()  # loading and serving leave the caller's autograd mode alone

    off = dataclasses.replace(params.tracking, log_model="false")
    registered = dataclasses.replace(params.tracking, log_model="true", register=True)
    second = start_run(params, stage="train")
    assert second.log_model(tiny_model, off) is None
    monkeypatch.setattr(model_log, "MODEL_LOG_LIMIT", 1000)  # `auto` skips models this large
    assert second.log_model(tiny_model, params.tracking) is None
    assert second.log_model(tiny_model, registered) == "models:/rarelm-test/1"  # true: any size
    second.finish()
    version = client.get_model_version("rarelm-test", "1")
    assert version.run_id == second.run_id and version.status == "READY"
    assert client.get_registered_model("rarelm-test").aliases == {}  # no alias moves by itself


def test_the_serving_defaults_are_rarelm_generates():
    from rarelm.evaluate.generate import Sampling
    from rarelm.tracking import serving

    assert serving.DEFAULTS == model_log.SERVING_DEFAULTS
    assert {k: getattr(Sampling(), k) for k in ("temperature", "top_k", "top_p")} == \
        {k: export.SAMPLING[k] for k in ("temperature", "top_k", "top_p")}


def test_register_and_champion_through_the_cli(store, tiny_model, workspace, monkeypatch):
    import mlflow
    from typer.testing import CliRunner

    from stages.cli import app

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    commit = git_commit()
    (workspace / "params.yaml").write_text("tracking: {experiment: registry, registered_model: rarelm-cli, "
                                          "system_metrics: false}\n")
    params = Params(tracking=TrackingParams(experiment="registry", system_metrics=False))
    ids = {}
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{workspace / 'none.db'}")
    result = CliRunner().invoke(app, ["champion", "1"])
    assert result.exit_code == 2 and "rarelm champion: error: no MLflow store at sqlite:///" in result.stderr
    assert not (workspace / "none.db").exists()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    for name, exact_match in (("exp-good", 0.75), ("exp-bad", 0.25)):
        monkeypatch.setenv("DVC_EXP_NAME", name)
        run = start_run(params, stage="train")
        run.log_metrics({"summary/term_exact_match": exact_match, "eval/ppl": 3.0})
        if name == "exp-good":  # exp-bad logs no model
            run.log_model(tiny_model, params.tracking)
        run.finish()
        ids[name] = run.run_id
    monkeypatch.delenv("DVC_EXP_NAME")
    cli = CliRunner()

    result = cli.invoke(app, ["register", "exp-good", "--champion"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"register: run {ids['exp-good']} (exp-good) -> models:/rarelm-cli/1, " \
        "alias champion"
    assert cli.invoke(app, ["register", ids["exp-good"]]).exit_code == 0  # by run id: version 2
    client = mlflow.MlflowClient(store)
    assert str(client.get_model_version_by_alias("rarelm-cli", "champion").version) == "1"  # not moved
    first = client.get_model_version("rarelm-cli", "1")
    assert len(commit) == 40 and first.description.splitlines() == [
        "experiment: exp-good", f"commit: {commit}", f"run: {ids['exp-good']}",
        "metrics: term_exact_match 0.75"]  # + one "data: ..." line per dataset input, here none
    assert first.tags == {"experiment": "exp-good", "git_commit": commit, "summary/term_exact_match": "0.75"}

    result = cli.invoke(app, ["champion", "2"])
    assert result.exit_code == 0
    assert result.stdout.strip() == "champion: models:/rarelm-cli@champion -> version 2"
    assert str(client.get_model_version_by_alias("rarelm-cli", "champion").version) == "2"
    for args, message in ((["champion", "9"], "registered model 'rarelm-cli' has no version 9"),
                          (["register", "exp-bad"], f"run {ids['exp-bad']} (exp-bad) logged no model"),
                          (["register", "exp-none"], "no run 'exp-none' in MLflow experiment 'registry'"),
                          (["register"], "models/model/mlflow_run.json: no such run file"),
                          (["register", "it's"], "run \"it's\" is not allowed")):
        result = cli.invoke(app, args)
        assert result.exit_code == 2 and result.stderr.strip().splitlines() == [
            f"rarelm {args[0]}: error: {message}" + result.stderr.strip().split(message, 1)[1]], result.output


def test_tensorboard_writes_the_step_curves_under_runs(workspace, store, monkeypatch):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # written even without a store
    params = Params(tracking=TrackingParams(tensorboard=True))
    run = start_run(params, stage="train")
    run.log_metrics({"train/loss": 3.0, "val/ce": 4.0}, step=10)
    run.log_metrics({"train/loss": 2.0}, step=20)
    run.log_metrics({"upstream/prepare/documents": 5.0}, step=0)
    run.finish()
    (folder,) = (workspace / "runs").iterdir()
    assert folder.name == f"train-{git_commit()[:7]}-demo_en-gpt2-4x128"
    events = EventAccumulator(str(folder))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["train/loss", "val/ce"]
    assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [(10, 3.0), (20, 2.0)]


def test_tensorboard_on_without_the_package_is_a_one_line_error(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard"
                        else real(name, *a))
    with pytest.raises(RarelmError, match=r"tracking.tensorboard = true needs the tensorboard package"):
        check_tensorboard(TrackingParams(tensorboard=True))
    check_tensorboard(TrackingParams(tensorboard=False))


def test_artifacts_go_beside_the_store_not_into_the_temporary_workspace(tmp_path, monkeypatch):
    """Under `dvc exp run --queue` the first run starts in DVC's temporary copy of the workspace;
    the experiment's artifacts must still land beside mlflow.db, which outlives that copy."""
    import mlflow

    store = tmp_path / "repo" / "mlflow.db"
    store.parent.mkdir()
    temporary = tmp_path / "repo" / ".dvc" / "tmp" / "exps" / "tmpabc"
    temporary.mkdir(parents=True)
    monkeypatch.chdir(temporary)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    run = start_run(Params(tracking=TrackingParams(experiment="beside", system_metrics=False)),
                             stage="train")
    (temporary / "report.txt").write_text("kept")
    run._client.log_artifact(run.run_id, str(temporary / "report.txt"), "eval")
    run.finish()
    experiment = mlflow.MlflowClient(f"sqlite:///{store}").get_experiment_by_name("beside")
    assert experiment.artifact_location == str(store.parent / "mlruns" / "beside")
    kept = list((store.parent / "mlruns" / "beside").rglob("report.txt"))
    assert len(kept) == 1 and kept[0].read_text() == "kept"
    assert not (temporary / "mlruns").exists()


def test_an_experiment_named_dot_dot_keeps_its_artifacts_under_mlruns(tmp_path, monkeypatch):
    """Issue 56 row 7: `tracking.experiment: ".."` put the experiment's artifacts at
    <repo>/mlruns/.. = the repository's root (untracked, not ignored), and MLflow's logged models
    under <repo>/models/ beside the pipeline's. Its folder is now mlruns/__ (rarelm/tracking/uri.py
    `experiment_folder`); the experiment keeps its name."""
    import mlflow

    store = tmp_path / "repo" / "mlflow.db"
    store.parent.mkdir()
    monkeypatch.chdir(store.parent)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    run = start_run(Params(tracking=TrackingParams(experiment="..", system_metrics=False)), stage="train")
    (tmp_path / "report.txt").write_text("kept")
    run._client.log_artifact(run.run_id, str(tmp_path / "report.txt"), "eval")
    run.finish()
    experiment = mlflow.MlflowClient(f"sqlite:///{store}").get_experiment_by_name("..")
    assert experiment.artifact_location == str(store.parent / "mlruns" / "__")
    kept = [p.relative_to(store.parent).parts[:2] for p in store.parent.rglob("report.txt")]
    assert kept == [("mlruns", "__")]
    assert sorted(p.name for p in store.parent.iterdir()) == ["mlflow.db", "mlflow.db.lock", "mlruns"]


def test_a_sweep_becomes_a_parent_run_over_its_experiments(store, workspace, monkeypatch):
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    params = Params(tracking=TrackingParams(experiment="sweeps", system_metrics=False))
    ids = {}
    for name in ("base-s1", "alpha07-s1", "other"):
        monkeypatch.setenv("DVC_EXP_NAME", name)
        run = start_run(params, stage="train")
        run.finish()
        ids[name] = run.run_id
    (workspace / "final").mkdir()
    (workspace / "final/report.md").write_text("| config | diff |\n")
    assert log_sweep("none-such", "headline-x", ["base-s1"], workspace / "final") is None
    parent = log_sweep("sweeps", "headline-abc", ["base-s1", "alpha07-s1"], workspace / "final")
    client = mlflow.MlflowClient(store)
    assert client.get_run(parent).info.run_name == "headline-abc"
    assert client.get_run(parent).data.tags["mlflow.note.content"].startswith("Sweep headline-abc: 2 runs")
    assert {n: client.get_run(i).data.tags.get("mlflow.parentRunId") for n, i in ids.items()} == {
        "base-s1": parent, "alpha07-s1": parent, "other": None}
    assert [a.path for a in client.list_artifacts(parent)] == ["report.md"]


# ------------------------------------------------------------------ the store: creation, credentials, moves

WRITER = """
import os, sys, time
import mlflow  # imported before the start line, so the three reach the fresh store together
from rarelm.tracking.run import start_run
from rarelm.params import Params, TrackingParams

folder, i = sys.argv[1], sys.argv[2]
open(os.path.join(folder, f"ready-{i}"), "w").close()
while not os.path.exists(os.path.join(folder, "go")):
    time.sleep(0.005)
run = start_run(Params(tracking=TrackingParams(system_metrics=False)), stage="train")
run.log_metrics({"train/loss": float(i)}, step=1)
run.require()
run.finish()
"""


def _store_tables(db: Path) -> list[str]:
    import sqlite3

    with sqlite3.connect(db) as con:
        return [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]


def test_three_writers_on_a_fresh_store_all_log(tmp_path):
    """Issue 25.1: three processes start a run at once on a store that does not exist yet. MLflow
    creates and migrates it on first use, unlocked: without the lock beside the store two of the
    three failed ("duplicate column name: step", "table tags already exists") and went on untracked."""
    import mlflow

    db = tmp_path / "mlflow.db"
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{db}", "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(i)], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(3)]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready-*"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    (tmp_path / "go").touch()
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    assert results == [(0, "")] * 3, results
    client = mlflow.MlflowClient(f"sqlite:///{db}")
    runs = client.search_runs([client.get_experiment_by_name("rarelm").experiment_id])
    assert sorted(r.data.metrics["train/loss"] for r in runs) == [0.0, 1.0, 2.0]
    assert not [t for t in _store_tables(db) if t.startswith("_alembic_tmp_")]
    assert (tmp_path / "mlflow.db.lock").is_file()


def _half_migrated(blank: Path, db: Path, with_run: bool) -> None:
    """A real store with a leftover `_alembic_tmp_tags`, as an interrupted migration leaves it."""
    import sqlite3

    import mlflow

    db.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(blank, db)
    if with_run:
        client = mlflow.MlflowClient(f"sqlite:///{db}")
        client.create_run(client.create_experiment("x"))
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE _alembic_tmp_tags AS SELECT * FROM tags")


def test_a_half_migrated_store_is_recreated_if_empty_else_refused_in_one_line(blank_store, tmp_path,
                                                                           monkeypatch, capsys):
    empty, full = tmp_path / "empty" / "mlflow.db", tmp_path / "full" / "mlflow.db"
    _half_migrated(blank_store, empty, with_run=False)
    _half_migrated(blank_store, full, with_run=True)
    params = Params(tracking=TrackingParams(system_metrics=False))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{empty}")
    run = start_run(params, stage="train")
    run.require()
    run.finish()
    assert run.run_id and not [t for t in _store_tables(empty) if t.startswith("_alembic_tmp_")]
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (f"rarelm train: warning: MLflow store {empty} was half-migrated (leftover table "
                    "_alembic_tmp_tags) and held no runs: created it anew")

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{full}")
    run = start_run(params, stage="train")
    with pytest.raises(RarelmError) as error:
        run.require()
    assert str(error.value) == (
        f"MLflow tracking store sqlite:///{full} cannot log (MLflow store {full} is half-migrated "
        f"(leftover table _alembic_tmp_tags from an interrupted schema migration) and holds 1 runs: "
        f"back it up, then move it aside (mv {full} {full}.broken) to start a new store); fix it, "
        "or set tracking.required: false to go on without tracking")
    assert capsys.readouterr().err == "" and "_alembic_tmp_tags" in _store_tables(full)  # untouched


def test_required_tracking_fails_in_one_line_and_optional_warns_once(monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://alice:s3cret@127.0.0.1:9/?token=t0k")
    run = start_run(Params(), stage="train")  # tracking.required: true by default
    run.log_metrics({"train/loss": 1.0}, step=1)
    with pytest.raises(RarelmError) as error:
        run.require()
    assert str(error.value).startswith(
        "MLflow tracking store http://***@127.0.0.1:9/?token=*** cannot log (MlflowException: ")
    assert str(error.value).endswith("set tracking.required: false to go on without tracking")
    optional = start_run(Params(tracking=TrackingParams(required=False)), stage="train")
    optional.require()  # not an error
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("rarelm train: warning: MLflow tracking store http://***@127.0.0.1:9/?token=*** ")
    assert "s3cret" not in str(error.value) + line and "t0k" not in str(error.value) + line


def test_git_remote_is_logged_without_user_info(store, workspace, monkeypatch):
    import mlflow

    subprocess.run(["git", "remote", "add", "origin", "https://oauth2:ghp_s3cret@github.com/org/rarelm.git"],
                   check=True)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    run = start_run(Params(tracking=TrackingParams(system_metrics=False)), stage="train")
    run.finish()
    tags = mlflow.MlflowClient(store).get_run(run.run_id).data.tags
    assert tags["mlflow.source.git.repoURL"] == "https://github.com/org/rarelm.git"


def test_run_file_names_the_repo_store_relatively_and_evaluate_logs_where_it_is_told(blank_store, workspace,
                                                                                    monkeypatch):
    """mlflow_run.json holds no absolute path or credential; evaluate resumes the training run only
    when the file names the store that this process logs to, else it makes a run of its own."""
    import mlflow

    other = workspace / "other.db"
    for db in (workspace / "mlflow.db", other):
        shutil.copy(blank_store, db)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    params = Params(tracking=TrackingParams(system_metrics=False))
    trained = start_run(params, stage="train")
    trained.save(workspace / "mlflow_run.json")
    trained.finish()
    info = json.loads((workspace / "mlflow_run.json").read_text())
    assert info == {"run_id": trained.run_id, "tracking_uri": "sqlite:///mlflow.db", "experiment": "rarelm"}
    same = open_run(workspace / "mlflow_run.json", "evaluate", params)
    same.finish()
    assert same.run_id == trained.run_id

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{other}")  # the model's record is no hint here
    run = open_run(workspace / "mlflow_run.json", "evaluate", params)
    run.log_metrics({"eval/ppl": 2.0})
    run.finish()
    mlrun = mlflow.MlflowClient(f"sqlite:///{other}").get_run(run.run_id)
    assert mlrun.data.tags["rarelm.model_run_id"] == trained.run_id
    assert mlrun.data.metrics == {"eval/ppl": 2.0}
    assert "eval/ppl" not in mlflow.MlflowClient(f"sqlite:///{workspace / 'mlflow.db'}").get_run(
        trained.run_id).data.metrics


RESUME_AND_LOG = """
import sys
from rarelm.tracking.run import start_run
from rarelm.params import Params, TrackingParams

run = start_run(Params(tracking=TrackingParams(system_metrics=False)), "train", run_id=sys.argv[1])
run._client.log_artifact(run.run_id, sys.argv[2], "eval")
run.require()
run.finish()
print(run.run_id)
"""


def test_a_moved_store_points_its_artifacts_at_its_new_folder(blank_store, tmp_path, monkeypatch):
    """Issue 24.5: a copied checkout carries mlflow.db and mlruns/; the copy's runs must write
    under the copy, never under the original (MLflow records absolute artifact paths)."""
    import mlflow

    original, copy = tmp_path / "original", tmp_path / "copy"
    original.mkdir()
    shutil.copy(blank_store, original / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{original / 'mlflow.db'}")
    run = start_run(Params(tracking=TrackingParams(system_metrics=False)), stage="train")
    (tmp_path / "report.txt").write_text("first")
    run._client.log_artifact(run.run_id, str(tmp_path / "report.txt"))
    run.finish()
    shutil.copytree(original, copy)
    before = {p: p.stat().st_mtime_ns for p in original.rglob("*")}

    (tmp_path / "report.txt").write_text("second")  # the copy resumes the copied run, in a process of its own
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{copy / 'mlflow.db'}", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", RESUME_AND_LOG, run.run_id, str(tmp_path / "report.txt")],
                         env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == run.run_id, out.stderr[-3000:]
    client = mlflow.MlflowClient(f"sqlite:///{copy / 'mlflow.db'}")
    assert client.get_run(run.run_id).info.artifact_uri.startswith(f"{copy}/mlruns/rarelm/")
    assert client.get_experiment_by_name("rarelm").artifact_location == f"{copy}/mlruns/rarelm"
    assert [p.read_text() for p in sorted(copy.rglob("report.txt"))] == ["second", "first"]  # eval/, then /
    assert {p: p.stat().st_mtime_ns for p in original.rglob("*")} == before  # nothing written there


START_RUN = """
import sys
import typer
from rarelm.tracking.run import start_run
from rarelm.errors import user_errors
from rarelm.params import Params, TrackingParams

def main(mode: str):  # as a stage runs it: a RarelmError is one line and exit 2
    with user_errors("train"):
        params = Params(tracking=TrackingParams(system_metrics=False, required=mode == "required"))
        run = start_run(params, stage="train")
        run.log_metrics({"train/loss": 1.0}, step=1)
        run.require()
        run.finish()

typer.run(main)
"""


@pytest.fixture
def read_only_store(blank_store, tmp_path):
    """A store whose file cannot be written: chmod for a user, the immutable attribute for root
    (whom file modes do not stop); prepared once before, as any store in use is."""
    db = tmp_path / "mlflow.db"
    shutil.copy(blank_store, db)
    prepare_store(f"sqlite:///{db}", "train")
    if os.geteuid() != 0:
        db.chmod(0o444)
    elif subprocess.run(["chattr", "+i", str(db)], capture_output=True).returncode != 0:
        pytest.skip("root without chattr +i: no way to make a file read-only here")
    yield db
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(db)], check=True)


@pytest.mark.parametrize("mode", ["optional", "required"])
def test_a_read_only_store_is_one_line(read_only_store, mode):
    """Issue 25.6: MLflow logs the failed INSERT with its traceback (~90 lines) before raising it."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{read_only_store}", "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", START_RUN, mode], env=env, capture_output=True, text=True)
    reason = "(sqlite3.OperationalError: attempt to write a readonly database)"
    if mode == "optional":
        assert result.returncode == 0 and result.stderr == (
            f"rarelm train: warning: MLflow tracking store sqlite:///{read_only_store} is not reachable "
            f"{reason}; going on without tracking\n")
    else:
        assert result.returncode == 2 and result.stderr == (
            f"rarelm train: error: MLflow tracking store sqlite:///{read_only_store} cannot log {reason}; "
            "fix it, or set tracking.required: false to go on without tracking\n")


def test_test_corpus_text_goes_to_mlflow_only_when_log_text_says(store, workspace, monkeypatch):
    """Issue 25.4: evaluate's per-occurrence rows are test-corpus text; `auto` sends them only to a
    store on this machine (a shared server gets the numbers, not the text)."""
    import mlflow

    from rarelm.evaluate.mlflow_log import log_eval_files

    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    rows = workspace / "eval_occurrences.jsonl"
    rows.write_text(json.dumps({"term": "bilateral pyelomyositis", "output": " start heparin"}) + "\n")
    (workspace / "eval.json").write_text('{"ppl": 3.0}')
    client = mlflow.MlflowClient(store)
    logged = {}
    for log_text in ("false", "true"):
        run = open_run(workspace / "none.json", "evaluate", Params())
        log_eval_files(run, [workspace / "eval.json", rows], logs_text(log_text, store))
        logged[log_text] = {a.path for a in client.list_artifacts(run.run_id, "eval")}
    assert logged == {"false": {"eval/eval.json"},
                      "true": {"eval/eval.json", "eval/eval_occurrences.jsonl", "eval/term_samples.json"}}
    assert logs_text("auto", store) and not logs_text("auto", "http://mlflow.internal:5000")


def test_description_names_what_differs_from_the_commits_params(tmp_path, monkeypatch):
    """`dvc exp run -S alpha=0.7` leaves alpha 0.7 in params.yaml: the next run's description says
    so against the commit's params.yaml (the one beside the stage, ./params.yaml, as under base/)."""
    from rarelm.params import load_params
    from rarelm.tracking.naming import committed_params, run_note

    (tmp_path / "base").mkdir()
    params_file = tmp_path / "base/params.yaml"
    params_file.write_text("alpha: 0.0\ncorpus:\n  path: data/raw/pg15.txt.gz\n"
                           "model:\n  name_or_path: base/model\n")
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"],
                ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"]):
        subprocess.run(cmd, cwd=tmp_path, check=True, capture_output=True)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True,
                            text=True).stdout.strip()
    params_file.write_text(params_file.read_text().replace("alpha: 0.0", "alpha: 0.7\nseed: 2"))
    monkeypatch.chdir(tmp_path / "base")
    committed = committed_params(commit)
    assert committed is not None and committed["alpha"] == 0.0 and committed["seed"] == 1337
    note = run_note(load_params("params.yaml"), {"mlflow.runName": "r", "git_commit": commit}, committed)
    assert note.startswith(f"r at commit {commit[:7]}; corpus data/raw/pg15.txt.gz (en); model: base/model; "
                           "alpha 0.7, ")
    assert note.endswith("; changed from the commit's params.yaml: seed 1337 -> 2, alpha 0 -> 0.7. "
                         "Read summary/ first.")
    assert committed_params("f" * 40) is None and committed_params("") is None
