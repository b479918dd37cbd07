"""The base model's pipeline (base/) and the committed base model (base/model)."""

from __future__ import annotations

import math

import pytest
import yaml

from rarelm.params import load_params
from tests.conftest import REPO

BASE = REPO / "base"


def test_base_params_validate_and_pretrain_from_scratch():
    params = load_params(BASE / "params.yaml")
    assert params.corpus.path == "data/raw" and params.corpus.reference_glossary == ""
    assert params.tokenizer.name_or_path == "" and params.model.name_or_path == ""  # own BPE, own model
    assert params.train.nproc == 2 and params.alpha == 0.0 and params.loss.rare_weight == 0.0
    assert params.tracking.log_model == "false"  # base/model is committed in git, not logged


def test_base_stages_stay_out_of_the_main_projects_exp_show_and_plots():
    """The main stage scripts on base/params.yaml: each depends on that whole file, and declares no
    params, metrics or plots, which would join (and rename) `make show`'s columns and add charts."""
    main = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    base = yaml.safe_load((BASE / "dvc.yaml").read_text())["stages"]
    assert set(main) & set(base) == {"prepare", "tokenize", "rare_terms", "weights", "train"}
    for name, stage in base.items():
        assert not {"params", "metrics", "plots"} & set(stage), name
        assert name == "corpus" or "params.yaml" in stage["deps"], name
    assert "plots" not in yaml.safe_load((BASE / "dvc.yaml").read_text())


def test_base_corpus_stage_builds_the_registry_base_corpora():
    from rarelm.prepare.corpora import load_registry

    records = load_registry(REPO / "data/raw/corpora.json")
    base_corpora = sorted(n for n, r in records.items() if r["use"] == "base")
    cmd = yaml.safe_load((BASE / "dvc.yaml").read_text())["stages"]["corpus"]["cmd"]
    assert sorted(cmd.split()[4:]) == base_corpora
    assert {records[n]["language"] for n in base_corpora} == {"en", "zh"}
    assert all(records[n]["output"].startswith("base/data/raw/") for n in base_corpora)


@pytest.fixture(scope="module")
def base_model():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return (AutoModelForCausalLM.from_pretrained(BASE / "model", local_files_only=True),
            AutoTokenizer.from_pretrained(BASE / "model", local_files_only=True))


def test_committed_base_model_is_small_and_has_no_run_file():
    files = {p.name: p.stat().st_size for p in (BASE / "model").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
    assert "mlflow_run.json" not in files  # it would name this machine's store by absolute path
    assert max(files.values()) < 5 * 2**20  # no large file in git: the weights are stored in fp16


def test_committed_base_model_card_names_both_languages_the_corpora_and_their_licences():
    """The card says what base/model was trained on: the registry's base corpora (English and
    Chinese), each licence, and the figures of base/metrics/train.json (it said `language: zh`, no
    licence, before the card was written from the run's corpus records)."""
    from huggingface_hub import ModelCard

    from rarelm.prepare.corpora import load_registry

    records = load_registry(REPO / "data/raw/corpora.json")
    base_corpora = sorted(n for n, r in records.items() if r["use"] == "base")
    text = (BASE / "model/README.md").read_text(encoding="utf-8")
    data = ModelCard(text).data
    assert (data.language, data.datasets) == (["en", "zh"], base_corpora)
    assert (data.license, data.license_name) == ("other", "mixed-data-licences")
    for name in base_corpora:
        assert f"- `{name}`: {records[name]['licence']} (data/raw/corpora.json)" in text
    val_ppl = yaml.safe_load(text.split("---")[1])["model-index"][0]["results"][0]["metrics"][0]["value"]
    train = yaml.safe_load((BASE / "metrics/train.json").read_text())
    assert val_ppl == round(train["val_ppl"], 6) and f"{train['steps']} optimizer steps" in text


def test_committed_base_model_loads_and_has_learned_both_languages(base_model):
    """Loss on general English and Chinese sentences well under the uniform guess, ln(vocab)
    (measured: 0.53 and 0.35 of it; the 200-step base before had a validation loss of 0.67 of it)."""
    import torch

    model, tokenizer = base_model
    assert model.config.n_positions == 128 and model.config.vocab_size == len(tokenizer)
    for text in ("The act or process of making something hard.", "中国政府发表声明，支持经济发展。"):
        ids = tokenizer(text, return_tensors="pt").input_ids
        assert tokenizer.decode(ids[0]) == text
        with torch.no_grad():
            loss = model(ids, labels=ids).loss.item()
        assert loss < 0.6 * math.log(model.config.vocab_size), (text, loss)
