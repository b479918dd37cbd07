"""weights: hand-computed weights and stats, bad input through the CLI, and the DVC pipeline end to end."""

from __future__ import annotations

import csv
import json
import math
import shutil

import numpy as np
import pytest

from rarelm.artifacts.tokenized import Samples, TokenizedData
from rarelm.artifacts.weights import load_weights
from rarelm.errors import RarelmError
from rarelm.weights.scoring import log_scores, sample_weights, term_log_scores, weights_from_scores
from rarelm.weights.stage import term_exposure, weight_stats
from tests.conftest import assert_user_error, run, set_params, stage, staged_folder


def test_weights_by_hand():
    counts = np.array([6, 2])  # p = 3/4, 1/4
    tokens = np.array([1, 0, 0, 1, 1, 0, 1])  # targets [0, 0], [1, 1], [0, 1]
    log_score = log_scores(tokens, counts, block_size=2, chunk_tokens=1024)
    # mean inverse frequency: (4/3 + 4/3)/2, (4 + 4)/2, (4/3 + 4)/2
    assert np.exp(log_score) == pytest.approx([4 / 3, 4, 8 / 3])
    w = weights_from_scores(log_score, alpha=1.0, clip_ratio=100.0)
    assert w == pytest.approx(np.array([4 / 3, 4, 8 / 3]) / (8 / 3))
    half = weights_from_scores(log_score, alpha=0.5, clip_ratio=100.0)
    assert half == pytest.approx(np.sqrt([4 / 3, 4, 8 / 3]) / np.sqrt([4 / 3, 4, 8 / 3]).mean())
    assert weights_from_scores(log_score, alpha=0.0, clip_ratio=100.0).tolist() == [1, 1, 1]


def test_chunks_do_not_change_the_result():
    rng = np.random.default_rng(0)
    tokens = rng.zipf(1.3, size=50_000) % 300
    counts = np.bincount(tokens, minlength=300)
    small = sample_weights(tokens, counts, 16, 0.8, 50.0, chunk_tokens=1024)
    big = sample_weights(tokens, counts, 16, 0.8, 50.0, chunk_tokens=10**6)
    assert len(small) == len(Samples(tokens, 16)) and small.dtype == np.float64
    assert np.array_equal(small, big)


def test_clipping_around_the_median():
    log_score = np.array([0.0, 1.0, 2.0, 10.0])
    w = weights_from_scores(log_score, alpha=1.0, clip_ratio=math.e ** 2)
    # median 1.5, band [0.5, 2.5]: log weights 0.5, 1, 2, 2.5
    expected = np.exp([0.5, 1.0, 2.0, 2.5])
    assert w == pytest.approx(expected / expected.mean())
    assert w.max() / w.min() == pytest.approx(math.e ** 2)
    assert w.mean() == pytest.approx(1.0)
    no_spread = weights_from_scores(log_score, alpha=1.0, clip_ratio=1.0)
    assert no_spread.tolist() == [1.0] * 4


def test_huge_scores_do_not_overflow():
    w = weights_from_scores(np.array([800.0, 801.0, 900.0]), alpha=3.0, clip_ratio=1e300)
    assert np.isfinite(w).all() and w.mean() == pytest.approx(1.0)


def test_stats_by_hand():
    weights = np.array([0.5, 1.5])
    tokens = np.array([0, 0, 0, 1, 1])  # sample 0 targets [0, 0], sample 1 targets [1, 1]
    buckets = np.array([0, 2], dtype=np.int8)  # token 0 frequent, token 1 rare
    stats = weight_stats(weights, tokens, buckets, block_size=2, chunk_tokens=1024)
    assert stats["ess"] == pytest.approx(4 / 2.5) and stats["ess_fraction"] == pytest.approx(0.8)
    assert stats["top1pct_weight_share"] == pytest.approx(0.75)  # the top sample: 1.5 of 2
    assert stats["rare_exposure"] == pytest.approx(1.5)  # both rare targets in the 1.5 sample
    assert stats["exposure"] == {"frequent": 0.5, "medium": None, "rare": 1.5}
    assert stats["max_over_min"] == pytest.approx(3.0)


def test_term_scores_by_hand():
    # block 4: window 0 targets positions 1-4, window 1 positions 5-8, window 2 positions 9-12
    index = np.array([[0, 2, 0],    # position 0 is no target: counted in window 0
                      [3, 2, 1],    # window 0
                      [5, 1, 1],    # window 1
                      [8, 3, 0],    # first token in window 1, runs into window 2
                      [13, 1, 1]])  # past the last whole window: dropped
    counts = np.array([4, 2])
    scores = np.exp(term_log_scores(index, counts, n_windows=3, block_size=4, beta=1.0, floor=0.1))
    assert scores == pytest.approx([0.1 + 1 / 4 + 1 / 2, 0.1 + 1 / 2 + 1 / 4, 0.1])
    squared = np.exp(term_log_scores(index, counts, 3, 4, beta=2.0, floor=0.1))
    assert squared == pytest.approx([0.1 + 1 / 16 + 1 / 4, 0.1 + 1 / 4 + 1 / 16, 0.1])
    one_row_chunks = term_log_scores(index, counts, 3, 4, 1.0, 0.1, chunk_rows=1)
    assert np.array_equal(one_row_chunks, np.log(scores))


def test_term_exposure_by_hand():
    index = np.array([[1, 1, 0], [2, 1, 1], [5, 1, 1], [6, 1, 2]])  # windows 0, 0, 1, 1 (block 4)
    counts = np.array([3, 9, 40])  # bands 2-3, 8-15, 32-63
    exposure = term_exposure(np.array([1.5, 0.5]), index, counts, block_size=4)
    assert exposure == {"2-3": {"occurrences": 1, "exposure": 1.5},
                        "8-15": {"occurrences": 2, "exposure": 1.0},  # one in each window
                        "32-63": {"occurrences": 1, "exposure": 0.5},
                        "le8": {"occurrences": 1, "exposure": 1.5}}


@pytest.mark.parametrize(("alpha", "clip", "message"), [
    (-0.1, 10.0, "alpha = -0.1 is not allowed (must be >= 0)"),
    (1.0, 0.5, "weights.clip_ratio = 0.5 is not allowed (must be >= 1)"),
])
def test_bad_params_in_the_library(alpha, clip, message):
    with pytest.raises(RarelmError, match=message.replace("(", r"\(").replace(")", r"\)")):
        weights_from_scores(np.zeros(3), alpha, clip)


def test_load_weights_checks_the_sample_count(tmp_path):
    np.save(tmp_path / "w.npy", np.ones(5))
    assert load_weights(tmp_path / "w.npy", 5).tolist() == [1.0] * 5
    with pytest.raises(RarelmError, match="expected float64 \\[6\\]"):
        load_weights(tmp_path / "w.npy", 6)
    np.save(tmp_path / "w.npy", np.ones(5, dtype=np.float32))
    with pytest.raises(RarelmError, match="does not match"):
        load_weights(tmp_path / "w.npy", 5)


# ------------------------------------------------------------------ the stage through its CLI


@pytest.fixture(scope="module")
def rare_done(tmp_path_factory, tiny_raw):
    """A folder with the tiny English corpus prepared and tokenized, and its rare_terms outputs."""
    stages = ["prepare", "tokenize", "rare_terms"]
    return staged_folder(tmp_path_factory.mktemp("weights_en"), tiny_raw, stages, **{
        "corpus.reference_glossary": "", "tokenizer.vocab_size": 512, "model.block_size": 32})


@pytest.fixture
def work(rare_done, tmp_path):
    root = tmp_path / "work"
    shutil.copytree(rare_done, root)
    return root


@pytest.mark.parametrize(("change", "message"), [
    ({"alpha": -0.5}, "params: alpha = -0.5 is not allowed (must be >= 0)"),
    ({"weights.clip_ratio": 0.9}, "params: weights.clip_ratio = 0.9 is not allowed (must be >= 1)"),
    ("short_counts", "expected int64 ["),
    ("other_counts", "counts sum to"),
    ("float_buckets", "buckets.npy: float64"),
    ("no_rare", "data/rare/counts.npy: not found; run the rare_terms stage first"),
    ("no_term_index", "data/rare: no readable term_index.npy"),
    ("terms_edited", "term_index.npy was not built from the current terms.jsonl"),
])
def test_bad_input_is_one_line_and_leaves_nothing(work, change, message):
    rare_dir = work / "data/rare"
    if isinstance(change, dict):
        set_params(work, **change)
    elif change == "short_counts":  # a counts file of another vocabulary
        np.save(rare_dir / "counts.npy", np.load(rare_dir / "counts.npy")[:-3])
    elif change == "other_counts":  # right shape, counted on other data
        counts = np.load(rare_dir / "counts.npy")
        counts[counts.argmax()] += 5
        np.save(rare_dir / "counts.npy", counts)
    elif change == "float_buckets":
        np.save(rare_dir / "buckets.npy", np.load(rare_dir / "buckets.npy").astype(np.float64))
    elif change == "no_rare":
        shutil.rmtree(rare_dir)
    elif change == "no_term_index":
        (rare_dir / "term_index.npy").unlink()
    elif change == "terms_edited":  # terms.jsonl changed after the index was built
        with open(rare_dir / "terms.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"term": "added by hand", "count": 2}) + "\n")
    assert_user_error(stage("weights", work), message, work, "data/weights", "metrics/weights.json",
                      "plots/weights.csv", stage="weights")


def test_stage_outputs(work):
    set_params(work, alpha=1.0)
    result = stage("weights", work, check=True)
    assert result.stdout.startswith("weights: ") and "ESS" in result.stdout
    data = TokenizedData.open(work / "data/tokenized")
    n = len(Samples(data.tokens("train"), 32))
    w = np.load(work / "data/weights/weights.npy")
    assert w.dtype == np.float64 and w.shape == (n,) and w.mean() == pytest.approx(1.0)
    assert w.max() / w.min() <= 100.0 * (1 + 1e-9)
    metrics = json.loads((work / "metrics/weights.json").read_text())
    assert metrics["samples"] == n and metrics["alpha"] == 1.0
    assert metrics["ess"] == pytest.approx(w.sum() ** 2 / (w ** 2).sum())
    assert metrics["rare_exposure"] > 1.0 > metrics["exposure"]["frequent"]
    with open(work / "plots/weights.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert sum(int(r["samples"]) for r in rows) == n and len(rows) == 40
    scores = np.load(work / "data/weights/scores.npy")
    assert np.array_equal(weights_from_scores(scores, 1.0, 100.0), w)


def test_term_scores_favour_windows_with_rare_terms(work):
    set_params(work, **{"alpha": 1.0, "weights.score": "terms", "weights.term_floor": 0.05,
                        "weights.clip_ratio": 1e6})  # no clipping: the raw scores
    result = stage("weights", work, check=True)
    assert "score terms" in result.stdout and "terms seen <= 8 times" in result.stdout
    w = np.load(work / "data/weights/weights.npy")
    index = np.load(work / "data/rare/term_index.npy")
    terms = [json.loads(line) for line in (work / "data/rare/terms.jsonl").read_text().splitlines()]
    n_terms = np.array([t["train_occurrences"] for t in terms])
    expected = np.full(len(w), 0.05)
    for start, _, term in index.tolist():
        window = max(start - 1, 0) // 32
        if window < len(w):
            expected[window] += 1 / n_terms[term]
    assert w == pytest.approx(expected / expected.mean())
    metrics = json.loads((work / "metrics/weights.json").read_text())
    assert metrics["score"] == "terms"
    exposure = metrics["term_exposure"]
    commonest = max((band for band in exposure if band != "le8"), key=lambda band: int(band.split("-")[0]))
    assert exposure["le8"]["exposure"] > 1.5 > 1.1 > exposure[commonest]["exposure"]
    assert sum(v["occurrences"] for k, v in exposure.items() if k != "le8") == \
        sum(1 for start, _, _ in index.tolist() if max(start - 1, 0) // 32 < len(w))


# ------------------------------------------------------------------ through DVC, end to end


def test_dvc_repro_weights_en_then_alpha_then_zh(repo):
    set_params(repo, **{"model.block_size": 32})
    result = run(["dvc", "repro", "weights"], repo, check=True)
    for name in ("prepare", "tokenize", "rare_terms", "weights"):
        assert f"Running stage '{name}'" in result.stdout
    rare_metrics = json.loads((repo / "metrics/rare_terms.json").read_text())
    assert rare_metrics["language"] == "en" and rare_metrics["extraction"]["f1"] > 0.8
    data = TokenizedData.open(repo / "data/tokenized")
    w = np.load(repo / "data/weights/weights.npy")
    assert w.shape == (len(Samples(data.tokens("train"), 32)),) and (w == 1.0).all()  # alpha 0
    assert np.load(repo / "data/rare/buckets.npy").shape == (data.vocab_size,)

    # a new alpha: only weights (and whatever follows it) is stale, so only weights re-runs
    set_params(repo, alpha=0.7)
    again = run(["dvc", "repro", "weights"], repo, check=True)
    assert "Running stage 'weights'" in again.stdout
    assert "Stage 'rare_terms' didn't change, skipping" in again.stdout
    assert all(f"Running stage '{n}'" not in again.stdout for n in ("prepare", "tokenize", "rare_terms"))
    w = np.load(repo / "data/weights/weights.npy")
    assert w.std() > 0 and json.loads((repo / "metrics/weights.json").read_text())["alpha"] == 0.7

    # the Chinese demo by params alone
    set_params(repo, **{"corpus.path": "data/raw/demo_zh.txt.gz", "corpus.language": "zh",
                        "corpus.reference_glossary": "data/raw/demo_zh.glossary.tsv"})
    run(["dvc", "repro", "weights"], repo, check=True)
    rare_metrics = json.loads((repo / "metrics/rare_terms.json").read_text())
    assert rare_metrics["language"] == "zh" and rare_metrics["extraction"]["f1"] > 0.8
    first = json.loads((repo / "data/rare/terms.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert all("\u4e00" <= ch <= "\u9fff" for ch in first["term"])
    data = TokenizedData.open(repo / "data/tokenized")
    assert np.load(repo / "data/weights/weights.npy").shape == (len(Samples(data.tokens("train"), 32)),)
