"""General-text replay (rarelm/train/replay.py, the build side in rarelm/evaluate/general_text.py):
the batch share by hand, the streams' state, the replay slices apart from the guard, and real tiny
runs (share 0 is the plain run bit for bit; a run with replay resumes bit for bit)."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from rarelm.errors import RarelmError
from rarelm.evaluate import general_text
from rarelm.params import Params, TrainParams, load_params
from rarelm.train.batches import SampleStream, to_batch, with_replay
from rarelm.train.replay import (
    JoinedTokens,
    ReplayStream,
    replay_rows,
    replay_seed,
    replay_tokens,
)
from rarelm.train.sampler import WeightedDistributedSampler
from tests.conftest import REPO, run, set_params, stage
from tests.helpers import run_paths, untracked_params, whole_then_crashed_and_resumed

GENERAL = REPO / "data" / "general"
N_DOMAIN = 1000  # domain tokens 0..999, replay tokens 5000..5999: a row tells where it came from
BLOCK = 8


def _streams(share: float, rank: int = 0, world: int = 1, seed: int = 3) -> ReplayStream:
    domain_tokens = np.arange(N_DOMAIN)
    replay_tokens_ = np.arange(5000, 6000)
    domain = SampleStream(WeightedDistributedSampler(np.ones((N_DOMAIN - 1) // BLOCK), world, rank, seed,
                                                     BLOCK), domain_tokens)
    replay = SampleStream(WeightedDistributedSampler(np.ones((1000 - 1) // BLOCK), world, rank,
                                                     replay_seed(seed), BLOCK), replay_tokens_)
    return ReplayStream(domain, replay, share)


# --------------------------------------------------------------------------- the batch share

def test_sixteen_rows_at_a_quarter_hold_exactly_four_replay_windows():
    """16 rows, share 0.25: floor(0.25 * 16 + 1/2) = 4 replay rows (the last four), 12 domain rows."""
    stream = _streams(0.25)
    starts = stream.take(16)
    x, y = to_batch(stream.tokens, starts, BLOCK, torch.device("cpu"))
    from_replay = (x >= 5000).all(dim=1)
    assert from_replay.tolist() == [False] * 12 + [True] * 4
    assert ((x < N_DOMAIN).all(dim=1) == ~from_replay).all()  # no row mixes the two texts
    # a replay row is the window of the replay text at its start minus the domain's length
    for row, start in zip(x[12:].tolist(), starts[12:].tolist(), strict=True):
        assert row == list(range(5000 + start - N_DOMAIN, 5000 + start - N_DOMAIN + BLOCK))
    assert (y[:, :-1] == x[:, 1:]).all()
    # the domain rows are exactly what the domain stream alone would have given
    alone = _streams(0.0).domain.take(12)
    assert starts[:12].tolist() == alone.tolist()


@pytest.mark.parametrize(("share", "rows", "expected"), [(0.25, 16, 4), (0.03, 16, 0), (0.05, 16, 1),
                                                         (0.1, 4, 0), (0.125, 4, 1), (0.5, 5, 3)])
def test_replay_rows_round_half_up(share, rows, expected):
    assert replay_rows(share, rows) == expected  # 0.05 * 16 = 0.8 -> 1; 0.125 * 4 = 0.5 -> 1; 2.5 -> 3


def test_each_rank_takes_its_own_share_of_disjoint_replay_windows():
    """Two ranks: each batch of 8 at share 0.25 has 2 replay rows per rank; over one replay epoch the
    ranks' replay windows are disjoint and cover the replay text's windows, like DistributedSampler."""
    ranks = [_streams(0.25, rank=r, world=2) for r in range(2)]
    n_replay_windows = (1000 - 1) // BLOCK  # 124: 62 per rank, 31 batches of 2 replay rows
    seen = []
    for _ in range(31):
        for stream in ranks:
            starts = stream.take(8)
            assert (starts[:6] < N_DOMAIN).all() and (starts[6:] >= N_DOMAIN).all()
            seen.extend((starts[6:] - N_DOMAIN).tolist())
    assert sorted(seen) == [k * BLOCK for k in range(n_replay_windows)]


def test_replay_stream_state_restores_both_streams_exactly():
    whole = _streams(0.25)
    expected = [whole.take(16).tolist() for _ in range(80)]  # past a replay epoch (124 windows / 4)
    first = _streams(0.25)
    got = [first.take(16).tolist() for _ in range(37)]
    state = json.loads(json.dumps(first.state()))  # a checkpoint holds plain data
    assert set(state) == {"epoch", "position", "replay"}
    resumed = _streams(0.25)
    resumed.restore(state)
    got += [resumed.take(16).tolist() for _ in range(43)]
    assert got == expected


def test_with_replay_off_is_the_stream_itself_and_on_draws_with_a_seed_of_its_own(tmp_path):
    domain = SampleStream(WeightedDistributedSampler(np.ones(10), seed=1, block_size=BLOCK), np.arange(81))
    params = Params(seed=1, model=dataclasses.replace(Params().model, block_size=BLOCK))
    assert with_replay(domain, params, None, 1, 0) is domain  # share 0: nothing wraps the plain stream
    on = dataclasses.replace(params, train=dataclasses.replace(params.train, replay_share=0.25,
                                                               replay_text="x.txt"))
    stream = with_replay(domain, on, np.arange(5000, 5081), 1, 0)
    assert isinstance(stream, ReplayStream) and stream.replay.sampler.seed == replay_seed(1) != 1
    assert stream.replay.sampler.num_replicas == 1 and len(stream.tokens) == 81 + 81


def test_joined_tokens_read_across_both_arrays_without_copying_the_first(tmp_path):
    domain = np.memmap(tmp_path / "train.tokens", dtype=np.uint16, mode="w+", shape=(4,))
    domain[:] = [7, 8, 9, 10]
    joined = JoinedTokens(domain, np.array([100, 101], dtype=np.int64))
    assert joined.domain is domain and len(joined) == 6
    assert joined[np.array([[0, 3, 4], [2, 5, 1]])].tolist() == [[7, 10, 100], [9, 101, 8]]


# --------------------------------------------------------------------------- params

@pytest.mark.parametrize(("overrides", "message"), [
    ({"replay_share": 0.25}, r"train.replay_text = '' is not allowed with train.replay_share = 0.25"),
    ({"replay_share": 0.02, "replay_text": "a.txt"},
     r"train.replay_share = 0.02 is not allowed with train.batch_size = 16 \(gives 0 replay rows"),
    ({"replay_share": 0.97, "replay_text": "a.txt"},
     r"train.replay_share = 0.97 is not allowed with train.batch_size = 16 \(gives 16 replay rows"),
])
def test_replay_params_that_cannot_work_are_one_line_errors(overrides, message):
    with pytest.raises(RarelmError, match=message):
        TrainParams(**overrides)
    assert TrainParams(replay_share=0.0, replay_text="").replay_share == 0.0


def test_replay_share_one_is_refused_on_load(tmp_path):
    text = (REPO / "params.yaml").read_text()
    assert "  replay_share: 0.0 " in text and '  replay_text: ""' in text  # off by default
    (tmp_path / "params.yaml").write_text(text.replace("  replay_share: 0.0 ", "  replay_share: 1.0 "))
    with pytest.raises(RarelmError, match=r"train.replay_share = 1.0? is not allowed"):
        load_params(tmp_path / "params.yaml")


# --------------------------------------------------------------------------- the replay text

class _Tokenizer:
    """Stands in for tokenizers.Tokenizer's encode_batch: one id per character (its code point)."""

    class _Encoding:
        def __init__(self, text):
            self.ids = [ord(c) for c in text]

    def encode_batch(self, texts, add_special_tokens=True):
        assert add_special_tokens is False
        return [self._Encoding(t) for t in texts]


def test_replay_tokens_are_the_documents_each_ended_by_eot(tmp_path):
    path = tmp_path / "r.txt"
    path.write_text("ab\n\n  \nc\n", encoding="utf-8")
    assert replay_tokens(path, _Tokenizer(), 0, 3).tolist() == [97, 98, 0, 99, 0]
    with pytest.raises(RarelmError, match=r"r.txt': 5 tokens, fewer than one window of "
                                          r"model.block_size \+ 1 = 6"):
        replay_tokens(path, _Tokenizer(), 0, 5)
    with pytest.raises(RarelmError, match=r"train.replay_text = .*none.txt': no such file"):
        replay_tokens(tmp_path / "none.txt", _Tokenizer(), 0, 3)
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(RarelmError, match="not UTF-8 text"):
        replay_tokens(path, _Tokenizer(), 0, 3)


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_replay_or_general_text_that_is_no_regular_file_is_one_line_before_any_read(tmp_path, kind):
    """Issue 56 row 9: `train.replay_text` or `eval.general_text` = a named pipe nobody writes hung
    the stage at its open; = /dev/zero read until memory ran out. Both readers go through
    rarelm.files `read_input`."""
    path = tmp_path / "pipe.txt" if kind == "fifo" else Path("/dev/zero")
    if kind == "fifo":
        os.mkfifo(path)
    what = "a named pipe (FIFO)" if kind == "fifo" else "a character device"
    with pytest.raises(RarelmError, match=re.escape(f"train.replay_text: {path} is {what}, not a file")):
        replay_tokens(path, _Tokenizer(), 0, 3)
    with pytest.raises(RarelmError, match=re.escape(f"eval.general_text: {path} is {what}, not a file")):
        general_text.read_documents(path)


# --------------------------------------------------------------------------- the replay slices

@pytest.mark.parametrize("language", ["en", "zh"])
def test_no_replay_document_is_in_the_guard_slice(language):
    """The committed replay slice trains on none of the forgetting guard's documents."""
    guard = set(general_text.read_documents(GENERAL / f"{language}.txt"))
    replay = general_text.read_documents(GENERAL / f"{language}.replay.txt")
    assert len(replay) > 1000 and 250_000 < (GENERAL / f"{language}.replay.txt").stat().st_size <= 300_000
    assert not guard & set(replay)
    assert len(set(replay)) == len(replay)  # the base's split is deduplicated


def _base_split(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in for the base pipeline's prepared split and raw corpora: two English and two Chinese
    source documents, one document from a source that is not redistributed."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for name, lines in (("gcide_en", ["apple n. a fruit", "bee n. an insect", "cat n. a pet"]),
                        ("reviews_zh", ["很好", "不错"]), ("peoples_daily_zh", ["新闻"])):
        with gzip.open(raw / f"{name}.txt.gz", "wt", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"text": t}) + "\n"
                             for t in ["cat n. a pet", "新闻", "很好", "apple n. a fruit", "不错"]))
    return train, raw


def test_build_replay_writes_the_train_documents_of_the_two_sources(tmp_path):
    train, raw = _base_split(tmp_path)
    out = tmp_path / "general"
    out.mkdir()
    assert general_text.build_replay(train, raw, out, max_bytes=1000) == {"en": 2, "zh": 2}
    assert (out / "en.replay.txt").read_text() == "cat n. a pet\napple n. a fruit\n"
    assert (out / "zh.replay.txt").read_text() == "很好\n不错\n"  # People's Daily left out
    # 13 + 17 bytes of English: at most 20 bytes keeps every second one, from the first
    assert general_text.build_replay(train, raw, out, max_bytes=20) == {"en": 1, "zh": 2}
    assert (out / "en.replay.txt").read_text() == "cat n. a pet\n"


def test_build_replay_refuses_a_document_of_the_guard_and_writes_nothing(tmp_path):
    train, raw = _base_split(tmp_path)
    out = tmp_path / "general"
    out.mkdir()
    (out / "en.txt").write_text("bee n. an insect\napple n. a fruit\n")  # the guard holds one of them
    result = run([str(REPO / ".venv/bin/python"), "-m", "rarelm.evaluate.general_text", "build-replay",
                  str(train), str(raw), str(out)], tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"general_text: {train}: 1 of its en documents are in the guard slice {out / 'en.txt'} "
        "(first: 'apple n. a fruit'); pass the base's train split, not its val split"]
    assert sorted(p.name for p in out.iterdir()) == ["en.txt"]


# --------------------------------------------------------------------------- real tiny runs

def _tiny(root: Path, monkeypatch, **train) -> Params:
    base = untracked_params(root, monkeypatch)
    tiny = {"nproc": 1, "max_steps": 4, "batch_size": 8, "log_every": 1, "eval_every": 4,
            "checkpoint_every": 4, "precision": "fp32", **train}
    return dataclasses.replace(base, model=dataclasses.replace(base.model, dropout=0.0),
                               train=dataclasses.replace(base.train, **tiny))


def test_share_zero_trains_the_plain_run_bit_for_bit_and_a_share_changes_it(weights_repo, tmp_path,
                                                                            monkeypatch):
    from rarelm.train import loop

    metrics = {}

    def weights(name: str, **train) -> bytes:
        metrics[name] = loop.train(_tiny(weights_repo, monkeypatch, **train), run_paths(tmp_path, name),
                                   progress=False)
        return (tmp_path / name / "model.safetensors").read_bytes()

    replay = str(GENERAL / "en.replay.txt")
    plain = weights("plain")
    assert weights("zero", replay_text=replay) == plain
    assert weights("quarter", replay_share=0.25, replay_text=replay) != plain
    # the same tokens trained; 2 of every 8 rows were general text, so 3/4 of a pass's share of the split
    assert metrics["quarter"]["tokens"] == metrics["plain"]["tokens"] == 4 * 8 * 32
    n_train_tokens = 395 * 32  # the tiny train split's 395 windows (tests/test_train.py)
    assert metrics["plain"]["epochs"] == round(1024 / n_train_tokens, 3)
    assert metrics["quarter"]["epochs"] == round(768 / n_train_tokens, 3)


def test_run_with_replay_resumes_bit_for_bit(weights_repo, tmp_path, monkeypatch):
    """Share 0.25 (2 of 8 rows): a run that crashes after its step-4 checkpoint and is started again
    ends byte-identical to an uninterrupted one; the checkpoint holds the replay stream's position."""
    from rarelm.train.inputs import Paths, input_files

    params = _tiny(weights_repo, monkeypatch, max_steps=7, replay_share=0.25,
                   replay_text=str(GENERAL / "zh.replay.txt"))
    assert GENERAL / "zh.replay.txt" in input_files(Paths(), params)  # its content keys the checkpoints
    whole_then_crashed_and_resumed(params, tmp_path, monkeypatch, crash_step=6)
    whole, resumed = (tmp_path / n / "model.safetensors" for n in ("whole", "resumed"))
    assert resumed.read_bytes() == whole.read_bytes()


def test_dvc_train_stage_depends_on_the_replay_slices():
    import yaml

    stage = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["train"]
    assert {"data/general/en.replay.txt", "data/general/zh.replay.txt"} <= set(stage["deps"])
    assert "train" in stage["params"]


def test_a_missing_replay_text_is_one_line_from_the_stage_and_nothing_is_written(weights_repo, tmp_path):
    import shutil

    root = tmp_path / "repo"
    shutil.copytree(weights_repo, root, symlinks=True, ignore=shutil.ignore_patterns(".dvc", ".git"))
    set_params(root, **{"train.nproc": 1, "train.replay_share": 0.25, "train.replay_text": "none.txt"})
    result = stage("train", root, "--out", "models/bad", "--cache", str(tmp_path / "cache"), "--no-progress")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "rarelm train: error: params: train.replay_text = 'none.txt': no such file (a UTF-8 text file, "
        "one document a line; e.g. data/general/en.replay.txt)"]
    assert not (root / "models" / "bad").exists()
