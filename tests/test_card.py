"""rarelm.tracking.card: the model card's front matter as huggingface_hub reads it, from the run itself."""

from __future__ import annotations

import json

import pytest
from huggingface_hub import ModelCard, ModelCardData

from rarelm.params import Params
from rarelm.tracking import card

METRICS = {"steps": 10, "tokens": 40960, "epochs": 1.5, "parameters": 1234, "val_ce": 1.23456789,
           "val_ppl": 3.4368, "val_rare_ce": 4.5, "precision": "bf16", "wall_time_s": 9.5}


def front_matter(text: str) -> ModelCardData:
    """The card as the Hub's client parses it, then a round trip through ModelCardData: a bad
    model-index, licence field or YAML raises here (ModelCard.validate() needs the network)."""
    data = ModelCard(text).data
    again = ModelCardData(**data.to_dict())
    assert again.to_dict() == data.to_dict()
    return again


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A checkout with a registry of two real corpora (one with its licence text) and a base model."""
    raw = tmp_path / "data/raw"
    raw.mkdir(parents=True)
    records = {"docs_en": {"language": "en", "licence": "GFDL-1.2+", "output": "data/raw/docs_en.txt.gz",
                           "licence_file": "data/raw/docs_en.LICENSE"},
               "news_zh": {"language": "zh", "licence": "MIT (the package)",
                           "output": "base/data/raw/news_zh.txt.gz"}}
    (raw / "corpora.json").write_text(json.dumps(records))
    (tmp_path / "base/data/raw").mkdir(parents=True)
    (tmp_path / "base/model").mkdir()
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_demo_card_front_matter_validates_with_the_runs_values(repo):
    text = card.model_card(Params(), METRICS, {"data/tokenized": "ab.dir"})
    data = front_matter(text)
    assert (data.license, data.license_name, data.datasets, data.language) == (
        "other", "rarelm-demo", ["demo_en"], "en")
    assert data.base_model is None and data.library_name == "transformers"
    assert data.metrics == ["cross_entropy", "perplexity"] and data.model_name == "rarelm-demo_en"
    results = {(r.metric_name, r.dataset_split, r.dataset_type): r.metric_value for r in data.eval_results}
    assert results == {("validation perplexity", "validation", "demo_en"): 3.4368,
                       ("validation cross-entropy (nats/token)", "validation", "demo_en"): 1.234568,
                       ("validation cross-entropy on the rare targets (nats/token)", "validation",
                        "demo_en"): 4.5}
    assert "The patient was" not in text and "wall_time" not in text
    assert "- objective: plain next-token cross-entropy; sampler alpha 0" in text
    assert "- precision: bf16; weights stored as float32; seed 1337." in text
    assert "1000 optimizer steps" not in text and "- 10 optimizer steps of 4096 tokens" in text
    assert text == card.model_card(Params(), METRICS, {"data/tokenized": "ab.dir"})  # no time, no run id


def test_fine_tune_of_a_base_model_on_a_registry_corpus(repo):
    params = Params.from_dict({"corpus": {"path": "data/raw/docs_en.txt.gz"},
                               "model": {"name_or_path": "base/model"},
                               "loss": {"rare_weight": 2.0, "targets": "terms"}})
    text = card.model_card(params, METRICS, {})
    data = front_matter(text)
    assert (data.base_model, data.license, data.license_name, data.datasets) == (
        "base/model", "gfdl", None, ["docs_en"])
    assert "fine-tuned from `base/model`" in text
    assert "- objective: cross-entropy with `loss.rare_weight` = 2, `loss.targets` = terms;" in text
    assert "GFDL-1.2+ (data/raw/corpora.json; full text: `data/raw/docs_en.LICENSE`)" in text
    # the base model's own card declares another licence: the model's is then "other"
    (repo / "base/model/README.md").write_text("---\nlicense: mit\n---\n\n# base\n")
    data = front_matter(card.model_card(params, METRICS, {}))
    assert (data.license, data.license_name) == ("other", "mixed-data-licences")
    (repo / "base/model/README.md").write_text("---\nlicense: gfdl\n---\n\n# base\n")
    assert front_matter(card.model_card(params, METRICS, {})).license == "gfdl"


def test_a_folder_corpus_run_one_level_down_as_base_does(repo, monkeypatch):
    monkeypatch.chdir(repo / "base")  # base/dvc.yaml's stages run in base/ on base/data/raw
    data = front_matter(card.model_card(Params.from_dict({"corpus": {"path": "data/raw"}}), {}, {}))
    assert (data.datasets, data.language, data.license) == (["news_zh"], "zh", "mit")
    assert data.eval_results is None and data.metrics is None  # nothing measured, nothing claimed


def test_own_corpus_has_an_unknown_licence_and_no_absolute_path(repo):
    params = Params.from_dict({"corpus": {"path": "/somewhere/clinic_notes.jsonl", "language": "auto"},
                               "model": {"name_or_path": "/models/org-base"}})
    text = card.model_card(params, {}, {})
    data = front_matter(text)
    assert (data.license, data.datasets, data.language, data.base_model) == (
        "unknown", ["clinic_notes"], "multilingual", "org-base")
    assert "/somewhere" not in text and "/models" not in text
    assert "not recorded: state the licence of your corpus before sharing this model" in text
    hub = Params.from_dict({"model": {"name_or_path": "org/name@v1.0"}})
    assert front_matter(card.model_card(hub, {}, {}, registry=None)).base_model == "org/name"


def test_hub_license_ids():
    assert [card.hub_license(t) for t in ("GFDL-1.1+ (no invariant sections)", "MIT (x)", "Apache-2.0",
                                          "GPL-3.0-or-later", "a custom text")] == [
        "gfdl", "mit", "apache-2.0", "gpl-3.0", "other"]
