"""rarelm.tracking.export: models/model as a complete Hugging Face folder (context, generation, card)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from rarelm import files
from rarelm.errors import RarelmError
from rarelm.params import Params
from rarelm.tracking import export


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny GPT-2 (32 positions) with the pipeline's BPE tokenizer, completed as `train` does."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from rarelm.tokenize.tokenization import EOT, save_hf_tokenizer, train_bpe

    out = tmp_path_factory.mktemp("model")
    tokenizer = train_bpe(iter(["the patient presented with acute myocardial infarction"] * 30),
                          vocab_size=300, min_frequency=1)
    save_hf_tokenizer(tokenizer, out)
    eot = tokenizer.token_to_id(EOT)
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=tokenizer.get_vocab_size(), n_positions=32, n_embd=16, n_layer=1,
                               n_head=2, bos_token_id=eot, eos_token_id=eot)).save_pretrained(out)
    metrics = {"steps": 10, "parameters": 1234, "val_ce": 1.23456789, "wall_time_s": 9.5,
               "tokens_per_s": 99.0}
    export.complete(out, export.model_card(Params(), metrics, {"data/tokenized": "ab" * 16 + ".dir"}))
    return out


def test_tokenizer_and_generation_config_carry_the_context_and_rarelm_defaults(folder):
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.model_max_length == 32 and tokenizer.truncation_side == "left"
    assert tokenizer.pad_token == "<|endoftext|>"
    config = GenerationConfig.from_pretrained(folder)
    assert (config.do_sample, config.temperature, config.top_k, config.top_p) == (True, 0.8, 50, 0.95)
    assert config.pad_token_id == config.eos_token_id == tokenizer.eos_token_id


def test_a_prompt_longer_than_the_context_through_transformers_pipeline(folder):
    from transformers import pipeline

    generate = pipeline("text-generation", model=str(folder))
    prompt = "the patient presented with acute myocardial infarction " * 8  # > 32 tokens
    assert len(generate.tokenizer(prompt).input_ids) > 32
    (out,) = generate(prompt, max_new_tokens=6, do_sample=False, handle_long_generation="hole")
    assert out["generated_text"].startswith(prompt) and len(out["generated_text"]) > len(prompt)
    # what the pipeline did by hand: the last 32 - 6 prompt tokens, then the greedy continuation
    ids = generate.tokenizer(prompt, return_tensors="pt").input_ids[:, -26:]
    greedy = generate.model.generate(ids, max_new_tokens=6, do_sample=False)[0, 26:]
    assert out["generated_text"] == prompt + generate.tokenizer.decode(greedy, skip_special_tokens=True)


def test_model_card_holds_data_params_and_metrics_but_no_time_or_path(folder):
    from huggingface_hub import ModelCard

    card = ModelCard.load(folder / "README.md")
    assert card.data.library_name == "transformers" and card.data.pipeline_tag == "text-generation"
    text = card.text
    assert "| `data/tokenized` | `" + "ab" * 16 + ".dir` |" in text
    assert "| `alpha` | `0` |" in text and "| `train.lr` |" in text
    assert "| `val_ce` | 1.23457 |" in text and "| `parameters` | 1234 |" in text
    assert "wall_time" not in text and "tokens_per_s" not in text and "tracking." not in text
    absolute = Params.from_dict({"corpus": {"path": "/somewhere/corpus.txt"}})
    assert "/somewhere" not in export.model_card(absolute, {}, {})
    same = {"val_ce": 1.0}
    assert export.model_card(Params(), same, {}) == export.model_card(Params(), same, {})


def test_no_room_for_a_prompt_is_an_error():
    assert export.keep_tokens(128, 28) == 100
    with pytest.raises(RarelmError, match="max_new_tokens = 128 is not allowed"):
        export.keep_tokens(128, 128)


def test_tokenizer_config_is_written_in_a_stable_order(folder):
    text = (folder / "tokenizer_config.json").read_text()
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def test_every_file_of_the_folder_is_readable_by_others(folder):
    # save_pretrained (safetensors) writes model.safetensors 0600; complete() gives it a plain file's mode
    umask = files.current_umask()
    assert umask == os.umask(umask)  # read without changing it
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir() if p.is_file()}
    assert "model.safetensors" in modes and "README.md" in modes
    assert set(modes.values()) == {0o666 & ~umask}
    if umask == 0o022:
        assert modes["model.safetensors"] == 0o644
