"""The check stage (rarelm/check.py, stages/check.py): what a stage would refuse, refused first.

Through `dvc repro` on a finished DAG (nothing deleted): tests/test_reliability.py,
test_a_bad_params_yaml_stops_dvc_repro_at_check_and_deletes_nothing.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from rarelm.check import MARKER, check
from rarelm.errors import RarelmError
from rarelm.params import load_params
from tests.conftest import REPO, run, set_params

BASE = REPO / "base/model"  # a committed pretrained GPT-2 of 128 positions, with its tokenizer


@pytest.fixture
def work(tmp_path: Path) -> Path:
    """params.yaml and the demo corpus with its glossary, in a folder of their own."""
    shutil.copy2(REPO / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "data/raw").mkdir(parents=True)
    for name in ("demo_en.txt.gz", "demo_en.glossary.tsv"):
        shutil.copy2(REPO / "data/raw" / name, tmp_path / "data/raw" / name)
    return tmp_path


def checked(root: Path, monkeypatch, **overrides) -> str:
    set_params(root, **overrides)
    monkeypatch.chdir(root)
    return check(load_params(root / "params.yaml"))


def test_the_demo_params_pass_and_say_what_was_checked(work, monkeypatch):
    assert checked(work, monkeypatch) == ("corpus data/raw/demo_en.txt.gz (1 file), a GPT-2-style model from "
                                          "scratch (block 128), a BPE tokenizer trained by tokenize")


def test_a_pretrained_model_passes_with_its_own_tokenizer(work, monkeypatch):
    summary = checked(work, monkeypatch,
                      **{"model.name_or_path": str(BASE), "tokenizer.name_or_path": str(BASE)})
    assert summary.endswith(f"model {BASE} (gpt2, 128 positions, block 128), tokenizer {BASE}")


@pytest.mark.parametrize(("overrides", "message"), [
    ({"corpus.path": "data/raw/missing.txt"}, "corpus.path: no such file or folder: data/raw/missing.txt"),
    ({"corpus.reference_glossary": "data/raw/missing.tsv"}, "corpus.reference_glossary: no such file"),
    ({"rare.glossary": "data/raw/missing.txt"}, "rare.glossary: no such file: data/raw/missing.txt"),
    ({"eval.general_text": "data/missing.txt"}, "eval.general_text = 'data/missing.txt': no such file"),
    ({"eval.general_text_outside": "data/missing.txt"},
     "eval.general_text_outside = 'data/missing.txt': no such file"),
    ({"train.replay_share": 0.25, "train.replay_text": "data/missing.txt"},
     "train.replay_text = 'data/missing.txt': no such file"),
    ({"train.replay_share": 0.25, "train.replay_text": "/dev/zero"},
     "train.replay_text: /dev/zero is a character device, not a file"),
    ({"model.name_or_path": str(BASE)},
     "tokenizer.name_or_path = '' is not allowed with model.name_or_path"),
    ({"model.name_or_path": "rarelm-test/not-cached", "tokenizer.name_or_path": "rarelm-test/not-cached"},
     "no hub model rarelm-test/not-cached at revision main in the local Hugging Face cache"),
    ({"model.name_or_path": str(BASE), "tokenizer.name_or_path": str(BASE), "model.block_size": 512},
     f"model.block_size = 512 is not allowed (must be <= 128, the positions {BASE} was trained with)"),
    ({"model.name_or_path": str(BASE), "tokenizer.name_or_path": str(BASE), "eval.block_size": 256},
     "eval.block_size = 256 is not allowed (must be <= the model's context length 128)"),
    ({"eval.block_size": 256},
     "eval.block_size = 256 is not allowed (must be <= the model's context length 128)"),
    ({"train.strategy": "fsdp", "train.nproc": 1}, "train.strategy = 'fsdp' is not allowed with 1 process"),
    ({"train.batch_size": 10**9}, "train.batch_size = 1000000000 does not fit"),
], ids=["corpus", "reference-glossary", "glossary", "general-text", "general-text-outside", "replay-text",
        "replay-device", "model-without-tokenizer",
        "hub-id-not-cached", "model-block-size", "eval-block-size-pretrained", "eval-block-size", "fsdp",
        "batch"])
def test_what_a_later_stage_would_refuse_is_refused_by_the_check(work, monkeypatch, tmp_path, overrides,
                                                                  message):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    with pytest.raises(RarelmError) as exc:
        checked(work, monkeypatch, **overrides)
    assert message in str(exc.value)


def test_a_tokenizer_that_is_not_the_models_is_refused(work, monkeypatch, tmp_path):
    other = tmp_path / "other-tokenizer"
    shutil.copytree(BASE, other, ignore=shutil.ignore_patterns("*.safetensors"))
    tokenizer = other / "tokenizer.json"  # one token renamed: another vocabulary
    spec = json.loads(tokenizer.read_text(encoding="utf-8"))
    vocab = spec["model"]["vocab"]
    first = min(vocab, key=vocab.get)
    vocab["zz-not-in-base"] = vocab.pop(first)
    tokenizer.write_text(json.dumps(spec), encoding="utf-8")
    with pytest.raises(RarelmError) as exc:
        checked(work, monkeypatch, **{"model.name_or_path": str(BASE), "tokenizer.name_or_path": str(other)})
    assert f"model.name_or_path: {BASE}'s tokenizer (" in str(exc.value)
    assert f"is not tokenizer.name_or_path's ({other})" in str(exc.value)


def test_the_stage_writes_its_constant_marker_or_one_line_and_nothing(work):
    out = run([sys.executable, "-m", "stages.check"], work)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("check: params.yaml is valid: corpus data/raw/demo_en.txt.gz (1 file), ")
    assert (work / "data/checked.txt").read_text(encoding="utf-8") == MARKER
    mtime = (work / "data/checked.txt").stat().st_mtime_ns
    set_params(work, alpha=0.7)  # another valid params.yaml: the same marker, not even rewritten
    assert run([sys.executable, "-m", "stages.check"], work).returncode == 0
    assert (work / "data/checked.txt").stat().st_mtime_ns == mtime

    set_params(work, **{"corpus.path": "data/raw/missing.txt"})
    bad = run([sys.executable, "-m", "stages.check"], work)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.splitlines() == [
        "rarelm check: error: corpus.path: no such file or folder: data/raw/missing.txt"]
    assert (work / "data/checked.txt").read_text(encoding="utf-8") == MARKER  # left as it was
    assert sorted(p.name for p in (work / "data").iterdir()) == ["checked.txt", "raw"]
