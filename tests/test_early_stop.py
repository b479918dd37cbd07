"""Early stopping on validation loss and the best weights (rarelm/train/early_stop.py): a tiny
training run on one process whose validation losses are scripted, so the best step is known."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from tests.helpers import crash_at, run_paths, untracked_params

# val_ce the scripted validation reports at steps 1, 2, 3, ...: the best is step 3; with patience 2
# the run stops after step 5 (steps 4 and 5 are no lower); without patience it runs to the end
SCRIPT = [5.0, 4.0, 3.0, 3.5, 3.2, 2.0, 2.5, 2.6]


def _scripted_run(root: Path, tmp_path: Path, monkeypatch, name: str, script=SCRIPT, crash_after: int = 0,
                  **train_params):
    """Train 8 steps on one process, validating every step with `script`'s losses; returns the metrics,
    the weights at each validation and the saved model's weights. `crash_after`: the first session
    fails after that step, the second resumes from its last checkpoint (every 2 steps)."""
    from safetensors.torch import load_file

    from rarelm.train import loop

    base = untracked_params(root, monkeypatch)
    params = dataclasses.replace(base, train=dataclasses.replace(
        base.train, nproc=1, max_steps=8, eval_every=1, log_every=1, checkpoint_every=2, precision="fp32",
        **train_params))
    snapshots: dict[int, dict[str, torch.Tensor]] = {}
    at = {"step": 0}  # the step being validated: one validation per step

    def scripted(model, *args):
        at["step"] += 1
        snapshots[at["step"]] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return script[at["step"] - 1], float("nan")

    monkeypatch.setattr(loop, "validation_loss", scripted)
    paths = run_paths(tmp_path, name)
    if crash_after:
        crash_at(crash_after, params, paths, monkeypatch, "killed")
        at["step"] = crash_after // 2 * 2  # the resumed session starts at the last checkpoint
    metrics = loop.train(params, paths, progress=False)
    assert json.loads(paths.metrics.read_text()) == metrics
    return metrics, snapshots, load_file(tmp_path / name / "model.safetensors"), paths


def test_early_stop_keeps_the_best_validation_step(weights_repo, tmp_path, monkeypatch):
    metrics, snapshots, saved, paths = _scripted_run(weights_repo, tmp_path, monkeypatch, "early",
                                                     early_stop_patience=2, keep_best=True)
    assert sorted(snapshots) == [1, 2, 3, 4, 5]  # stopped after two validations without a lower loss
    assert (metrics["steps"], metrics["best_val_step"], metrics["best_val_ce"]) == (5, 3, 3.0)
    assert (metrics["stopped_early"], metrics["saved_step"]) == (True, 3)
    assert metrics["tokens"] == 5 * 4 * 32 and metrics["epochs"] > 0
    assert metrics["saved_epochs"] == pytest.approx(metrics["epochs"] * 3 / 5, abs=1e-3)
    val = {int(r["step"]): float(r["val_ce"]) for r in csv.DictReader(paths.plots.open()) if r["val_ce"]}
    assert min(val, key=val.get) == metrics["best_val_step"]  # the chosen step is the best validation's
    for key, tensor in saved.items():  # the saved model is step 3's weights, not step 5's
        assert torch.equal(tensor, snapshots[3][key]), key
    assert any(not torch.equal(saved[k], snapshots[5][k]) for k in saved)
    assert not (paths.cache).exists() or not any(paths.cache.rglob("best-rank*.pt"))  # cleared when done


def test_without_patience_it_runs_to_the_end_and_keep_best_picks_the_lowest(weights_repo, tmp_path,
                                                                            monkeypatch):
    metrics, snapshots, saved, _ = _scripted_run(weights_repo, tmp_path, monkeypatch, "best", keep_best=True)
    assert sorted(snapshots) == list(range(1, 9))
    assert (metrics["steps"], metrics["best_val_step"], metrics["stopped_early"]) == (8, 6, False)
    for key, tensor in saved.items():
        assert torch.equal(tensor, snapshots[6][key]), key


def test_off_by_default_no_new_figures(weights_repo, tmp_path, monkeypatch):
    metrics, snapshots, saved, _ = _scripted_run(weights_repo, tmp_path, monkeypatch, "plain")
    assert "best_val_step" not in metrics and metrics["steps"] == 8
    for key, tensor in saved.items():  # the last step's weights
        assert torch.equal(tensor, snapshots[8][key]), key


def test_a_resumed_run_keeps_the_best_weights_from_before_the_crash(weights_repo, tmp_path, monkeypatch):
    """The best validation (step 3) lies before the crash (after step 5) and the checkpoint it
    resumes from (step 4): the resumed run saves step 3's weights, as the uninterrupted run does."""
    script = [5.0, 4.0, 3.0, 3.5, 3.2, 3.3, 3.4, 3.6]
    whole, snapshots, saved_whole, _ = _scripted_run(weights_repo, tmp_path, monkeypatch, "whole", script,
                                                     keep_best=True)
    resumed, _, saved_resumed, _ = _scripted_run(weights_repo, tmp_path, monkeypatch, "resumed", script,
                                                 crash_after=5, keep_best=True)
    assert (whole["best_val_step"], resumed["best_val_step"], resumed["saved_step"]) == (3, 3, 3)
    for key, tensor in saved_whole.items():
        assert torch.equal(tensor, snapshots[3][key]) and torch.equal(saved_resumed[key], tensor), key
