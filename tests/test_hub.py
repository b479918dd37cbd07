"""Hub ids in model/tokenizer.name_or_path, resolved from a temporary Hugging Face cache.

The writing-assistant scenario in miniature: a tiny GPT-2 whose tokenizer is a BERT-style
Chinese character vocabulary (as uer/gpt2-chinese-* ship: no eos, documents end with
[SEP]), saved as two commits of `rarelm-test/gpt2-zh` in a cache laid out as
huggingface_hub lays it out (blobs/, snapshots/<commit>/ of symlinks, refs/main), with
HF_HUB_CACHE pointing at it. Nothing here touches the network.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from rarelm import hub
from rarelm.artifacts.tokenized import Samples, TokenizedData
from rarelm.errors import RarelmError
from rarelm.params import ModelParams, Params, TokenizerParams
from rarelm.tokenize import tokenization
from tests.conftest import REPO, assert_user_error, run
from tests.helpers import write_prepared

REPO_ID = "rarelm-test/gpt2-zh"
COMMITS = ("a" * 40, "b" * 40)  # the second is refs/main
DOCS = {"train": ["质押式回购是一种短期融资方式。", "发行可交换债券需要质押股票。"] * 12,
        "val": ["短期融资需要质押。"], "test": ["可交换债券是一种融资方式。"]}


def _tiny_model_folder(folder: Path, seed: int) -> None:
    """A 1-layer GPT-2 and a character-level WordPiece tokenizer (BERT-style, [SEP] ends text)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    chars = sorted({c for docs in DOCS.values() for d in docs for c in d})
    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars])}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=False)  # spaces around Han chars
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]", sep_token="[SEP]",
                            pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]"
                            ).save_pretrained(folder)
    torch.manual_seed(seed)
    sep = vocab["[SEP]"]
    GPT2LMHeadModel(GPT2Config(vocab_size=len(vocab), n_positions=64, n_embd=16, n_layer=1,
                               n_head=2, bos_token_id=sep, eos_token_id=sep)).save_pretrained(folder)


def add_snapshot(cache: Path, repo_id: str, folder: Path, commit: str, ref: str | None) -> Path:
    """Put folder's files into cache as huggingface_hub stores a downloaded commit."""
    from huggingface_hub.file_download import repo_folder_name

    storage = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    snapshot = storage / "snapshots" / commit
    (storage / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for path in sorted(folder.iterdir()):
        blob = storage / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
        shutil.copyfile(path, blob)
        (snapshot / path.name).symlink_to(os.path.relpath(blob, snapshot))
    if ref:
        (storage / "refs").mkdir(exist_ok=True)
        (storage / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """Two commits of REPO_ID (different weights, same tokenizer) and the bare id `tinygpt`."""
    root = tmp_path_factory.mktemp("hub")
    cache = root / "cache"
    for seed, commit in enumerate(COMMITS):
        folder = root / f"model-{seed}"
        _tiny_model_folder(folder, seed)
        add_snapshot(cache, REPO_ID, folder, commit, "main" if commit == COMMITS[-1] else None)
    add_snapshot(cache, "tinygpt", root / "model-0", "c" * 40, "main")
    return cache


@pytest.fixture
def hf_cache(cache, monkeypatch) -> Path:
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """The prepare stage's output for DOCS, stats.json included (the tokenize stage's CLI reads it)."""
    return write_prepared(tmp_path_factory.mktemp("prepared"), DOCS, stats=True)


def tokenize(prepared: Path, out: Path, name_or_path: str) -> TokenizedData:
    out.mkdir()
    meta = tokenization.tokenize(TokenizerParams(name_or_path=name_or_path), prepared, out)
    (out / "meta.json").write_text(json.dumps(meta))
    return TokenizedData.open(out)


def test_the_cache_layout_is_the_one_huggingface_hub_reads(hf_cache):
    from huggingface_hub import snapshot_download

    found = snapshot_download(REPO_ID, cache_dir=hf_cache, local_files_only=True)
    assert Path(found).name == COMMITS[-1] and (Path(found) / "model.safetensors").is_file()
    assert hub.cache_dir() == hf_cache
    for name, repo, commit in [(REPO_ID, REPO_ID, COMMITS[-1]),
                               (f"{REPO_ID}@main", REPO_ID, COMMITS[-1]),
                               (f"{REPO_ID}@{COMMITS[0]}", REPO_ID, COMMITS[0]),
                               ("tinygpt", "tinygpt", "c" * 40)]:
        source = hub.resolve(name, "model.name_or_path")
        assert (source.hub_id, source.commit) == (repo, commit), name
        assert str(source) == f"{repo}@{commit}" and (source.path / "config.json").is_file()


def test_hub_tokenizer_is_resolved_pinned_and_recorded(hf_cache, prepared, tmp_path):
    from transformers import AutoTokenizer

    data = tokenize(prepared, tmp_path / "main", REPO_ID)
    assert data.meta["tokenizer"] == f"{REPO_ID}@{COMMITS[-1]}"
    assert data.meta["tokenizer_commit"] == COMMITS[-1]
    hf = AutoTokenizer.from_pretrained(data.tokenizer_dir)
    assert data.eot_id == hf.sep_token_id and hf.eos_token_id is None  # [SEP] ends documents
    tokens, offsets = data.tokens("test"), data.offsets("test")
    assert hf.decode(tokens[offsets[0]:offsets[1] - 1].tolist()).replace(" ", "") == DOCS["test"][0]
    pinned = tokenize(prepared, tmp_path / "pinned", f"{REPO_ID}@{COMMITS[0]}")
    assert pinned.meta["tokenizer_commit"] == COMMITS[0]
    assert np.array_equal(pinned.tokens("train"), data.tokens("train"))


def test_folder_wins_and_neither_is_one_line(hf_cache, prepared, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(hf_cache / "models--rarelm-test--gpt2-zh/snapshots" / COMMITS[0],
                    tmp_path / REPO_ID)  # a local folder spelt like the hub id
    source = hub.resolve(REPO_ID, "tokenizer.name_or_path")
    assert source == hub.Pretrained(Path(REPO_ID)) and str(source) == REPO_ID
    for name in ("models/foo", f"{REPO_ID}@v9", "tinygpt@" + "d" * 40):
        with pytest.raises(RarelmError) as info:
            hub.resolve(name, "tokenizer.name_or_path")
        message = str(info.value)
        assert "\n" not in message and "no such folder" in message and name.split("@")[0] in message
        assert str(hf_cache) in message and "hf download" in message, message
    with pytest.raises(RarelmError, match="no such folder: ./nope"):  # not spelt like a hub id
        hub.resolve("./nope", "tokenizer.name_or_path")


def test_hub_model_loads_and_a_new_revision_is_a_new_run(hf_cache, prepared, tmp_path):
    from rarelm.train.checkpoint import run_key
    from rarelm.train.model import build_model, fingerprint_files, provenance

    data = tokenize(prepared, tmp_path / "tok", REPO_ID)
    keys, weights = set(), []
    for name, commit in [(REPO_ID, COMMITS[-1]), (f"{REPO_ID}@{COMMITS[0]}", COMMITS[0])]:
        params = ModelParams(name_or_path=name, block_size=32)
        model = build_model(params, data)
        assert model.get_input_embeddings().num_embeddings == data.vocab_size
        weights.append(model.transformer.wte.weight.detach().clone())
        pinned = provenance(params, data)
        assert pinned == {"model_commit": commit, "tokenizer_commit": COMMITS[-1]}
        keys.add(run_key({"model": name} | pinned, fingerprint_files(params)))
    assert len(keys) == 2 and not weights[0].equal(weights[1])
    assert provenance(ModelParams(), tokenize(prepared, tmp_path / "bpe", "")) == {}


def test_train_records_the_commits_in_metrics_and_mlflow(hf_cache, prepared, tmp_path, monkeypatch):
    from rarelm.train.inputs import Paths
    from rarelm.train.loop import train

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    data = tokenize(prepared, tmp_path / "tokenized", REPO_ID)
    params = Params.from_dict({
        "model": {"name_or_path": f"{REPO_ID}@{COMMITS[0]}", "block_size": 16},
        "train": {"nproc": 1, "max_steps": 2, "batch_size": 2, "warmup_steps": 0, "log_every": 1,
                  "eval_every": 2, "eval_batches": 1, "precision": "fp32"},
        "tracking": {"experiment": "test-hub", "system_metrics": False, "log_model": "false"}})
    (tmp_path / "rare").mkdir()
    np.save(tmp_path / "rare/buckets.npy", np.zeros(data.vocab_size, np.int8))
    (tmp_path / "weights").mkdir()
    n = len(Samples(data.tokens("train"), 16))
    np.save(tmp_path / "weights/weights.npy", np.full(n, 1 / n))
    paths = Paths(tokenized=tmp_path / "tokenized", rare=tmp_path / "rare",
                  weights=tmp_path / "weights", model=tmp_path / "model",
                  metrics=tmp_path / "train.json", plots=tmp_path / "train.csv",
                  metrics_dir=tmp_path / "none", cache=tmp_path / "ckpt")
    metrics = train(params, paths, progress=False)
    assert metrics["model_commit"] == COMMITS[0] and metrics["tokenizer_commit"] == COMMITS[-1]
    assert json.loads(paths.metrics.read_text())["model_commit"] == COMMITS[0]

    from mlflow.tracking import MlflowClient

    # this test's store, not the process-wide URI another test in this worker may have set
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("test-hub").experiment_id])
    tags = run.data.tags
    assert tags["model_commit"] == COMMITS[0] and tags["tokenizer_commit"] == COMMITS[-1]


def test_stage_cli_missing_hub_id_is_one_line_exit_2(cache, prepared, tmp_path):
    (tmp_path / "params.yaml").write_text("tokenizer:\n  name_or_path: rarelm-test/absent@v2\n")
    result = run([sys.executable, "-m", "stages.tokenize", "--params", str(tmp_path / "params.yaml"),
                  "--prepared", str(prepared), "--out", str(tmp_path / "tokenized"),
                  "--metrics", str(tmp_path / "tokenize.json")], REPO,
                 env={"HF_HUB_CACHE": str(cache)})
    assert_user_error(result, "rarelm-test/absent", tmp_path, "tokenized", "tokenize.json",
                      stage="tokenize")
    assert str(cache) in result.stderr and "hf download rarelm-test/absent --revision v2" in result.stderr


def test_a_relative_folder_missing_here_is_found_under_dvc_root(tmp_path, monkeypatch):
    """A queued or --temp experiment's copy of the workspace lacks an untracked model folder
    (smollm2/model): it is taken from DVC_ROOT, the workspace, and still recorded as spelt."""
    workspace, copy = tmp_path / "workspace", tmp_path / "copy"
    (workspace / "smollm2" / "model").mkdir(parents=True)
    copy.mkdir()
    monkeypatch.chdir(copy)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    with pytest.raises(RarelmError, match="no such folder: smollm2/model"):
        hub.resolve("smollm2/model", "model.name_or_path")
    monkeypatch.setenv("DVC_ROOT", str(workspace))
    source = hub.resolve("smollm2/model", "model.name_or_path")
    assert source.path == workspace / "smollm2" / "model" and str(source) == "smollm2/model"
    (copy / "smollm2" / "model").mkdir(parents=True)  # a folder here wins
    assert hub.resolve("smollm2/model", "model.name_or_path") == hub.Pretrained(Path("smollm2/model"))
    with pytest.raises(RarelmError, match="no such folder"):  # only relative names are looked up there
        hub.resolve(str(tmp_path / "elsewhere" / "model"), "model.name_or_path")
