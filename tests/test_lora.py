"""LoRA through peft (rarelm/train/lora.py): what trains, what a checkpoint holds, the merged model."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from rarelm.errors import RarelmError
from rarelm.params import LoraParams, TrainParams
from rarelm.train import lora
from rarelm.train.checkpoint import CheckpointStore
from rarelm.train.dist import Dist
from rarelm.train.optim import configure_optimizer

IDS = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))


def tiny_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2,
                                      bos_token_id=0, eos_token_id=0))


def trained_a_little(model):
    """Two AdamW steps, so the adapters' B is no longer zero (else merging changes nothing)."""
    optimizer = configure_optimizer(model, TrainParams(lr=0.05), torch.device("cpu"))
    for _ in range(2):
        model(input_ids=IDS, labels=IDS).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return optimizer


def test_rank_zero_is_the_model_itself():
    model = tiny_gpt2()
    assert lora.apply(model, LoraParams()) is model and not lora.is_lora(model)


def test_only_the_adapters_get_gradients():
    model = lora.apply(tiny_gpt2(), LoraParams(rank=4, alpha=8.0))
    model(input_ids=IDS, labels=IDS).loss.backward()
    with_grad = {n for n, q in model.named_parameters() if q.grad is not None}
    assert with_grad == {n for n, q in model.named_parameters() if q.requires_grad}
    # peft's default for GPT-2 is c_attn: an A (4 x 16) and a B (48 x 4) per layer
    assert sorted(n.split("attn.c_attn.")[1] for n in with_grad) == \
        ["lora_A.default.weight", "lora_A.default.weight", "lora_B.default.weight", "lora_B.default.weight"]
    assert lora.trainable_parameters(model) == 2 * (4 * 16 + 48 * 4)


def test_a_checkpoint_holds_only_the_adapters_and_their_optimizer_state(tmp_path):
    import torch.distributed.checkpoint as dcp

    model = lora.apply(tiny_gpt2(), LoraParams(rank=2, target_modules=["c_attn", "c_fc"]))
    optimizer = trained_a_little(model)
    store = CheckpointStore(tmp_path, "key")
    path = store.save(2, model, optimizer, {"step": 2}, Dist())
    keys = dcp.FileSystemReader(str(path / "dcp")).read_metadata().state_dict_metadata
    tensors = [k for k in keys if k.startswith(("model.", "optimizer.state."))]
    assert len([k for k in tensors if k.startswith("model.")]) == 8  # 2 layers x 2 modules x A, B
    assert tensors and all(".lora_A." in k or ".lora_B." in k for k in tensors), tensors
    # resumed into a fresh LoRA model: the adapters come back, the base is the pretrained one
    fresh = lora.apply(tiny_gpt2(), LoraParams(rank=2, target_modules=["c_attn", "c_fc"]))
    fresh_optimizer = configure_optimizer(fresh, TrainParams(lr=0.05), torch.device("cpu"))
    store.load_weights(path, fresh, fresh_optimizer)
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


def test_saved_model_is_merged_and_its_logits_are_base_plus_adapter(tmp_path):
    from peft import PeftModel

    tiny_gpt2().save_pretrained(tmp_path / "base")
    model = lora.apply(AutoModelForCausalLM.from_pretrained(tmp_path / "base"), LoraParams(rank=4))
    trained_a_little(model)
    model.eval()
    with torch.no_grad():
        expected = model(input_ids=IDS).logits
    lora.save_merged(model, tmp_path / "out").save_pretrained(tmp_path / "out")
    assert (tmp_path / "out" / "adapter" / "adapter_config.json").is_file()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(merged).__name__ == "GPT2LMHeadModel"
    assert not any("lora" in n for n, _ in merged.named_parameters())
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "base"),
                                        tmp_path / "out" / "adapter").eval()
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base").eval()
    with torch.no_grad():
        assert torch.allclose(merged(input_ids=IDS).logits, expected, atol=1e-5)
        assert torch.allclose(adapted(input_ids=IDS).logits, expected, atol=1e-5)
        assert not torch.allclose(base(input_ids=IDS).logits, expected, atol=1e-3)  # it learned


def test_modules_the_model_lacks_are_named_in_the_error():
    with pytest.raises(RarelmError, match=r"model.lora.target_modules = \['c_attn', 'q_proj'\] is not "
                                          r"allowed: this 'gpt2' model has no module named 'q_proj'"):
        lora.apply(tiny_gpt2(), LoraParams(rank=4, target_modules=["c_attn", "q_proj"]))


def test_an_architecture_without_a_peft_default_needs_target_modules():
    model = tiny_gpt2()
    model.config.model_type = "homemade"
    with pytest.raises(RarelmError, match="target_modules = \\[\\] is not allowed for a 'homemade' model"):
        lora.apply(model, LoraParams(rank=4))
