"""The train stage: loss weighting by hand, the loop's pieces, and real runs through the CLI.

The CLI tests share one throw-away repo (module scope) in which `dvc repro` builds the
tiny pipeline and trains with 2 DDP processes; a later run with the same params, killed
and then finished by torchrun by hand, must end byte-identical.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import hashlib
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rarelm.artifacts.tokenized import Samples
from rarelm.errors import RarelmError
from rarelm.objectives.rare_weight import rare_weighted_loss
from rarelm.objectives.selection import rare_mask
from rarelm.params import TrainParams
from rarelm.train import precision as precision_module
from rarelm.train.batches import SampleStream, epochs_to_train, logits_after_lead, to_batch
from rarelm.train.checkpoint import CheckpointStore, run_key
from rarelm.train.optim import lr_at
from rarelm.train.precision import (
    CPU_BF16_ENV,
    cached_probe,
    cpu_has_bf16,
    cpu_has_native_bf16,
    pick_precision,
    probe_key,
    probe_seconds,
    resolve,
)
from tests.conftest import REPO, run, set_params, train_repo
from tests.helpers import distance, untracked_params, whole_then_crashed_and_resumed

METRIC_KEYS = {"steps", "tokens", "wall_time_s", "tokens_per_s", "loss", "ce", "rare_ce",
               "val_ce", "val_rare_ce", "val_ppl", "epochs", "parameters", "trainable_parameters",
               "state_bytes_per_rank", "precision", "precision_reason", "matmul", "matmul_reason"}
PROBE_KEYS = {"precision_probe_fp32_s", "precision_probe_bf16_s"}  # where auto timed the model


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- loss

def test_rare_weighted_loss_matches_hand_computation():
    # vocab 3, targets [0, 2, 1, 2]; token 2 is rare; rare_weight 3 -> weights [1, 4, 1, 4]
    probs = torch.tensor([[[0.7, 0.2, 0.1], [0.3, 0.3, 0.4], [0.25, 0.5, 0.25], [0.1, 0.1, 0.8]]])
    targets = torch.tensor([[0, 2, 1, 2]])
    is_rare = torch.tensor([False, False, True])
    ce = [-math.log(0.7), -math.log(0.4), -math.log(0.5), -math.log(0.8)]
    expected = (1 * ce[0] + 4 * ce[1] + 1 * ce[2] + 4 * ce[3]) / (1 + 4 + 1 + 4)
    loss, stats = rare_weighted_loss(torch.log(probs).to(torch.bfloat16).float(), targets,
                                     is_rare, 3.0)
    loss32, _ = rare_weighted_loss(torch.log(probs), targets, is_rare, 3.0)
    assert loss32.item() == pytest.approx(expected, rel=1e-6)
    assert loss.item() == pytest.approx(expected, rel=1e-2)  # bf16 logits, fp32 loss
    ce_sum, n, rare_sum, n_rare = rare_weighted_loss(torch.log(probs), targets, is_rare, 3.0)[1]
    assert (n.item(), n_rare.item()) == (4, 2)
    assert ce_sum.item() == pytest.approx(sum(ce), rel=1e-6)
    assert rare_sum.item() == pytest.approx(ce[1] + ce[3], rel=1e-6)
    assert stats.dtype == torch.float32


def test_rare_weight_zero_is_plain_cross_entropy_and_gradients_follow_the_weights():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, requires_grad=True)
    targets = torch.randint(0, 11, (2, 5))
    is_rare = torch.zeros(11, dtype=torch.bool)
    is_rare[targets[0, 0]] = True
    plain, _ = rare_weighted_loss(logits, targets, is_rare, 0.0)
    assert plain.item() == pytest.approx(F.cross_entropy(logits.reshape(-1, 11),
                                                         targets.reshape(-1)).item(), rel=1e-6)
    # with rare_weight w, the rare target's gradient is (1 + w) times a common one's, relatively
    weighted, _ = rare_weighted_loss(logits, targets, is_rare, 5.0)
    (grad,) = torch.autograd.grad(weighted, logits)
    (grad0,) = torch.autograd.grad(plain, logits)
    scale = grad[0, 1].norm() / grad0[0, 1].norm()  # a common target
    rare_rows = [(b, t) for b in range(2) for t in range(5) if is_rare[targets[b, t]]]
    for b, t in rare_rows:
        assert (grad[b, t].norm() / grad0[b, t].norm()).item() == pytest.approx(6 * scale.item(),
                                                                                 rel=1e-5)


def test_rare_mask_pads_a_larger_model_vocabulary():
    mask = rare_mask(np.array([0, 2, 1, 3, 2], dtype=np.int8), 7)
    assert mask.tolist() == [False, True, False, False, True, False, False]


# --------------------------------------------------------------------------- loop pieces

def test_lr_warms_up_then_decays_to_min_lr():
    p = TrainParams(lr=1e-3, min_lr=1e-4, warmup_steps=4, max_steps=14)
    lrs = [lr_at(s, p) for s in range(15)]
    assert lrs[:4] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert lrs[4] == pytest.approx(1e-3) and lrs[9] == pytest.approx(5.5e-4)
    assert lrs[14] == pytest.approx(1e-4)
    assert all(np.diff(lrs[4:]) <= 0)


def test_precision_choice():
    cpu = torch.device("cpu")
    assert pick_precision("fp32", cpu) == (None, False)
    assert pick_precision("bf16", cpu) == (torch.bfloat16, False)
    assert pick_precision("auto", cpu)[1] is False
    with pytest.raises(RarelmError, match="train.precision = 'fp16'"):
        pick_precision("fp16", cpu)


@pytest.mark.parametrize(("forced", "expected"), [("0", None), ("1", torch.bfloat16)])
def test_auto_precision_follows_the_cpu_and_can_be_forced_as_on_the_other_kind(
        monkeypatch, forced, expected):
    """`auto` on CPU: bf16 with AVX512-BF16/AMX, fp32 without; RARELM_CPU_BF16 runs as on the
    other kind (how the suite is exercised as on an AVX2-only CPU on a bf16 one and back)."""
    cpu = torch.device("cpu")
    monkeypatch.setenv(CPU_BF16_ENV, forced)
    assert cpu_has_bf16() is (forced == "1")
    assert pick_precision("auto", cpu) == (expected, False)  # never a GradScaler on CPU
    monkeypatch.delenv(CPU_BF16_ENV)
    assert cpu_has_bf16() is cpu_has_native_bf16()
    monkeypatch.setenv(CPU_BF16_ENV, "yes")
    with pytest.raises(RarelmError, match="RARELM_CPU_BF16 = 'yes' is not allowed"):
        pick_precision("auto", cpu)
    assert pick_precision("fp32", cpu) == (None, False)  # a pinned precision never asks


def _tiny_gpt2(n_embd: int = 16):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=n_embd, vocab_size=32,
                                      n_positions=8, bos_token_id=0, eos_token_id=0)).train()


class StepClock:
    """A timer for the probe: each fp32 step takes `fp32` s and each bf16 step `bf16` s (the
    probe alternates fp32, bf16 and reads the clock before and after each timed step)."""

    def __init__(self, fp32: float, bf16: float):
        self.now, self.calls, self.durations = 0.0, 0, (fp32, bf16)

    def __call__(self) -> float:
        if self.calls % 2:  # the end of a step
            self.now += self.durations[(self.calls // 2) % 2]
        self.calls += 1
        return self.now


@pytest.mark.parametrize(("fp32_s", "bf16_s", "expected"), [(0.3, 0.2, torch.bfloat16),
                                                            (0.2, 0.3, None)])
def test_auto_precision_probe_picks_the_faster_side_and_caches_it(monkeypatch, tmp_path,
                                                                  fp32_s, bf16_s, expected):
    """On a CPU with native bf16 `auto` times the real model in both precisions (timer patched
    here) and trains in the faster; a second run reads the cache and does not time again."""
    monkeypatch.delenv(CPU_BF16_ENV, raising=False)
    monkeypatch.setattr(precision_module, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setattr(precision_module, "clock", StepClock(fp32_s, bf16_s))
    model, cpu = _tiny_gpt2(), torch.device("cpu")
    x = torch.randint(0, 32, (2, 8))
    key = probe_key(model, tuple(x.shape))
    first = resolve("auto", cpu, lambda: cached_probe(tmp_path, key,
                                                      lambda: probe_seconds(model, x, x, steps=1)))
    name = "bf16" if expected is torch.bfloat16 else "fp32"
    assert (first.dtype, first.use_scaler, first.reason) == (expected, False, f"probe: {name} faster")
    assert first.probe == pytest.approx({"fp32": fp32_s, "bf16": bf16_s})
    assert first.metrics() == {"precision": name, "precision_reason": f"probe: {name} faster",
                               "precision_probe_fp32_s": fp32_s, "precision_probe_bf16_s": bf16_s}
    assert json.loads((tmp_path / "precision" / f"{key}.json").read_text()) == first.probe
    again = resolve("auto", cpu, lambda: cached_probe(tmp_path, key, pytest.fail))
    assert again.dtype is expected and again.probe["cached"] is True
    assert again.describe() == (f"precision {name} (probe: {name} faster; fp32 {fp32_s:.3f} s, "
                                f"bf16 {bf16_s:.3f} s a step, cached)")
    assert all(p.grad is None for p in model.parameters())  # the probe leaves no gradients


def test_probe_cache_key_changes_with_the_model_shape_and_micro_batch():
    small, wider = _tiny_gpt2(16), _tiny_gpt2(32)
    assert probe_key(small, (2, 8)) == probe_key(_tiny_gpt2(16), (2, 8))
    assert len({probe_key(small, (2, 8)), probe_key(wider, (2, 8)), probe_key(small, (4, 8))}) == 3
    small.transformer.h[0].attn.c_attn.weight.requires_grad_(False)  # e.g. LoRA: others train
    assert probe_key(small, (2, 8)) != probe_key(_tiny_gpt2(16), (2, 8))


def test_attention_runs_in_fp32_under_cpu_bf16_autocast_and_is_sdpa_elsewhere(tmp_path):
    """rarelm.train.model.ATTENTION: without autocast the logits are plain "sdpa"'s bit for bit
    (with and without padding); under bf16 autocast the attention kernel takes the bf16
    projections as fp32 and its output is that fp32 result rounded to bf16, not bf16 sdpa's;
    the saved config.json names no attention, so plain transformers loads the model."""
    from transformers import AutoModelForCausalLM
    from transformers.models.gpt2 import modeling_gpt2

    from rarelm.params import ModelParams
    from rarelm.train.model import ATTENTION, gpt2_config

    torch.manual_seed(0)
    model = modeling_gpt2.GPT2LMHeadModel(gpt2_config(
        ModelParams(n_layer=2, n_head=2, n_embd=32, block_size=16, dropout=0.0), 64, 0)).eval()
    assert model.config._attn_implementation == ATTENTION
    x, mask = torch.randint(0, 64, (3, 16)), torch.ones(3, 16, dtype=torch.long)
    mask[0, :5] = 0  # a left-padded row
    ours = [model(x).logits, model(x, attention_mask=mask).logits]
    model.set_attn_implementation("sdpa")
    assert torch.equal(ours[0], model(x).logits)
    assert torch.equal(ours[1], model(x, attention_mask=mask).logits)
    model.set_attn_implementation(ATTENTION)
    seen = []  # (query, key, value, output) of the first layer's attention under autocast
    original = modeling_gpt2.ALL_ATTENTION_FUNCTIONS[ATTENTION]

    def attention(module, q, k, v, m, **kwargs):
        out, weights = original(module, q, k, v, m, **kwargs)
        if module.layer_idx == 0:
            seen.append((q, k, v, out))
        return out, weights
    modeling_gpt2.ALL_ATTENTION_FUNCTIONS[ATTENTION] = attention
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            model(x)
    finally:
        modeling_gpt2.ALL_ATTENTION_FUNCTIONS[ATTENTION] = original
    q, k, v, out = seen[0]
    assert q.dtype == out.dtype == torch.bfloat16
    fp32 = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert torch.equal(out, fp32.transpose(1, 2).to(torch.bfloat16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert bf16.dtype == torch.bfloat16 and not torch.equal(out, bf16.transpose(1, 2))
    model.save_pretrained(tmp_path)
    assert "attn_implementation" not in (tmp_path / "config.json").read_text()
    plain = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert plain.config._attn_implementation == "sdpa" and torch.equal(plain(x).logits, ours[0])


def test_training_windows_run_without_a_mask_and_without_reading_a_tensor_on_the_host():
    """rarelm.train.model.for_windows: GPT-2, Llama and Gemma 3 with a longer sliding window (32
    against windows of 24) give the same logits and gradients bit for bit, from a forward + backward
    that reads no tensor's value on the host (with the mask transformers builds: at least one read
    a forward, a GPU sync); Gemma 3 with a window shorter than the windows keeps its masks, and so
    does any other attention."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from transformers import (
        Gemma3ForCausalLM,
        Gemma3TextConfig,
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
    )

    from rarelm.train.model import ATTENTION, WINDOWS, attention, for_windows

    class HostReads(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += func is torch.ops.aten._local_scalar_dense.default
            return func(*args, **(kwargs or {}))

    def forward_backward(model, x):
        model.zero_grad()
        with HostReads() as reads:
            logits = model(input_ids=x, use_cache=False).logits
            logits.float().square().mean().backward()
        return logits.detach(), [p.grad.clone() for p in model.parameters()], reads.count

    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=50, attn_implementation=attention())
    models = {"gpt2": lambda: GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=50,
                                                         attn_implementation=attention())),
              "llama": lambda: LlamaForCausalLM(LlamaConfig(**small)),
              "gemma3": lambda: Gemma3ForCausalLM(Gemma3TextConfig(**small, head_dim=8, sliding_window=32))}
    x = torch.randint(0, 50, (3, 24))
    for name, build in models.items():
        torch.manual_seed(0)
        model = build().eval()  # no dropout: both passes see the same function
        masked = forward_backward(model, x)
        assert model.config._attn_implementation == ATTENTION and masked[2] >= 1, name
        assert for_windows(model, 24).config._attn_implementation == WINDOWS, name
        logits, grads, reads = forward_backward(model, x)
        assert reads == 0 and torch.equal(logits, masked[0]), name
        assert all(torch.equal(a, b) for a, b in zip(grads, masked[1], strict=True)), name
    torch.manual_seed(0)
    gemma = models["gemma3"]()
    assert for_windows(gemma, 33).config._attn_implementation == ATTENTION  # its window is shorter
    gemma.set_attn_implementation("eager")
    assert for_windows(gemma, 8).config._attn_implementation == "eager"


def test_auto_precision_without_native_bf16_is_fp32_and_never_probes(monkeypatch):
    """This machine kind (AVX2 only): `auto` stays fp32 without timing anything (emulated bf16
    is ~10x slower), so the demo's `dvc repro` trains as before; RARELM_CPU_BF16 still forces
    either side without a probe, and a pinned precision is never probed."""
    cpu = torch.device("cpu")
    monkeypatch.delenv(CPU_BF16_ENV, raising=False)
    monkeypatch.setattr(precision_module, "cpu_has_native_bf16", lambda: False)
    auto = resolve("auto", cpu, pytest.fail)
    assert (auto.dtype, auto.reason, auto.probe) == (None, "no native bf16", None)
    assert auto.metrics() == {"precision": "fp32", "precision_reason": "no native bf16"}
    assert auto.describe() == "precision fp32 (no native bf16)"
    for forced, dtype in (("1", torch.bfloat16), ("0", None)):
        monkeypatch.setenv(CPU_BF16_ENV, forced)
        chosen = resolve("auto", cpu, pytest.fail)
        assert (chosen.dtype, chosen.reason) == (dtype, f"RARELM_CPU_BF16={forced}")
    assert resolve("bf16", cpu, pytest.fail).reason == "pinned"


@pytest.mark.parametrize(("bf16_gpu", "expected"), [(True, (torch.bfloat16, False)),
                                                    (False, (torch.float16, True))])
def test_auto_precision_on_cuda_uses_a_grad_scaler_only_with_fp16(monkeypatch, bf16_gpu, expected):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16_gpu)
    monkeypatch.setenv(CPU_BF16_ENV, "0")  # the CPU's answer plays no part on a GPU
    assert pick_precision("auto", torch.device("cuda")) == expected
    assert pick_precision("fp16", torch.device("cuda")) == (torch.float16, True)


def test_sample_stream_crosses_epochs_and_restores_exactly():
    from rarelm.train.sampler import WeightedDistributedSampler

    sampler = WeightedDistributedSampler(np.arange(1, 9, dtype=float), num_replicas=2, rank=1,
                                         seed=3, block_size=4)
    whole = SampleStream(sampler)
    drawn = np.concatenate([whole.take(3) for _ in range(5)])  # 15 starts over 4-long epochs
    assert np.array_equal(drawn[:4], sampler.starts(0))
    assert np.array_equal(drawn[4:8], sampler.starts(1))
    assert set(drawn[:4] % 4) == {0} and set(drawn[4:8] % 4) == {sampler.offset(1)} != {0}
    first = SampleStream(sampler)
    head = np.concatenate([first.take(3) for _ in range(2)])
    resumed = SampleStream(sampler)
    resumed.restore(first.state())
    tail = np.concatenate([resumed.take(3) for _ in range(3)])
    assert np.array_equal(np.concatenate([head, tail]), drawn)


def test_to_batch_reads_windows_at_start_positions():
    tokens = np.arange(100, 120, dtype=np.uint16)
    x, y = to_batch(tokens, np.array([5, 0, 15]), 4, torch.device("cpu"))
    assert x.dtype == torch.int64 and x.shape == y.shape == (3, 4)
    assert x[0].tolist() == [105, 106, 107, 108] and y[0].tolist() == [106, 107, 108, 109]
    assert y[2].tolist() == [116, 117, 118, 119]  # the last whole window
    samples = Samples(tokens, 4)  # a Samples reads its token array
    assert torch.equal(to_batch(samples, np.array([4]), 4, torch.device("cpu"))[0],
                       torch.from_numpy(samples[1][:-1].astype(np.int64))[None])
    with pytest.raises(IndexError, match="runs outside the 20 tokens"):
        to_batch(tokens, np.array([16]), 4, torch.device("cpu"))


def test_a_lead_token_is_read_before_every_training_and_validation_window_and_never_scored():
    """A model pretrained with <bos> first (Gemma 3) trains and validates with it before every window:
    the logits line up with the window's own positions, and validation's cross-entropy equals the one
    computed by hand with <bos> in front; no lead is the model's own forward."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from rarelm.train.dist import Dist
    from rarelm.train.validate import validation_loss

    torch.manual_seed(0)
    model = Gemma3ForCausalLM(Gemma3TextConfig(
        vocab_size=20, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, sliding_window=8, max_position_embeddings=64,
        initializer_range=0.5)).eval()
    samples = Samples(np.arange(3, 19), block_size=5)
    x, y = to_batch(samples, np.array([0, 5]), 5, torch.device("cpu"))
    with torch.no_grad():
        led = logits_after_lead(model, x, (2,))
        whole = model(input_ids=torch.cat([torch.full((2, 1), 2), x], 1)).logits
        assert torch.equal(logits_after_lead(model, x), model(input_ids=x).logits)
    assert led.shape == (2, 5, 20) and torch.equal(led, whole[:, 1:])
    assert not torch.allclose(led, model(input_ids=x).logits)  # the lead changes what the model reads

    ce, _ = validation_loss(model, samples, np.array([0, 1]), 2, torch.device("cpu"), contextlib.nullcontext,
                            torch.zeros(20, dtype=torch.bool), Dist(), lead=(2,))
    assert ce == pytest.approx(F.cross_entropy(led.flatten(0, 1), y.flatten()).item(), rel=1e-5)


def test_epochs_to_train_rounds_up():
    tp = TrainParams(max_steps=300, batch_size=4, grad_accum=2)
    assert epochs_to_train(tp, 2, 600) == 8  # 2400 per rank / 300 = 8 exactly
    assert epochs_to_train(tp, 2, 700) == 7  # 350 per rank: 6.9 epochs
    assert epochs_to_train(dataclasses.replace(tp, max_steps=1), 1, 10**6) == 1


def test_checkpoints_are_verified_and_only_the_last_two_kept(tmp_path, capsys):
    from rarelm.train.dist import Dist

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    store = CheckpointStore(tmp_path, run_key({"a": 1}, []))
    for step in (1, 2, 3):
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        store.save(step, model, optimizer, {"step": step, "rng": torch.get_rng_state(),
                                            "python": (3, (1, 2), None)}, Dist())
        if step == 2:
            weight_2 = model.weight.detach().clone()
            moment_2 = optimizer.state[model.weight]["exp_avg"].clone()
    assert [p.name for p in sorted(store.dir.iterdir())] == ["step-00000002", "step-00000003"]
    manifest = json.loads((store.dir / "step-00000003" / "manifest.json").read_text())
    assert manifest["world_size"] == 1 and {"state.pt", "dcp/.metadata", "dcp/__0_0.distcp"} <= \
        set(manifest["sha256"])
    # a flipped byte in the newest one's shard: skipped with one warning, the one before it is used
    path = store.dir / "step-00000003" / "dcp" / "__0_0.distcp"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    best = store.latest_valid()
    assert best is not None and best.name == "step-00000002"
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1 and "skipping corrupt checkpoint" in warning[0]
    assert "dcp/__0_0.distcp does not match its checksum" in warning[0]
    fresh = torch.nn.Linear(3, 2)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    state = store.load_state(best)
    store.load_weights(best, fresh, fresh_optimizer)
    assert state["step"] == 2 and state["world_size"] == 1
    assert torch.equal(fresh.weight, weight_2)
    assert torch.equal(fresh_optimizer.state[fresh.weight]["exp_avg"], moment_2)
    # a half-written one (no manifest yet) is skipped too
    shutil.rmtree(store.dir / "step-00000002")
    (store.dir / "step-00000003" / "manifest.json").unlink()
    assert store.latest_valid() is None
    assert run_key({"a": 1}, []) != run_key({"a": 2}, [])


def test_a_checkpoint_state_written_before_run_state_loads(tmp_path):
    """state.pt as the loop wrote it when its state was a plain dict (same keys, plus the scaler
    and every rank's part): it loads as the RunState it held, and saves back under the same keys."""
    from rarelm.train.dist import Dist
    from rarelm.train.state import RunState

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    store = CheckpointStore(tmp_path, run_key({"a": 1}, []))
    curves = [{"step": 4, "loss": 2.5, "ce": 2.5, "rare_ce": 6.0, "lr": 0.003, "grad_norm": 0.5,
               "tokens_per_s": 100.0}]
    old = {"step": 5, "curves": curves, "elapsed": 1.25, "tokens": 640, "run_id": "abc123",
           "val": {"val_ce": 3.0, "val_rare_ce": 4.0}, "scaler": {},
           "ranks": [{"stream": {"epoch": 0, "position": 20}, "rng": {}, "objective": {}}]}
    saved = store.load_state(store.save(5, model, optimizer, old, Dist()))
    state = RunState.from_dict(saved)
    assert state == RunState(step=5, curves=curves, elapsed=1.25, tokens=640, run_id="abc123",
                             val={"val_ce": 3.0, "val_rare_ce": 4.0})
    # saved back under the same keys, plus early stopping's record of the best validation (none yet)
    assert state.as_dict() == {**{k: v for k, v in old.items() if k not in ("scaler", "ranks")}, "best": {}}
    assert list(state.as_dict()) == ["step", "curves", "elapsed", "tokens", "run_id", "val", "best"]
    assert saved["world_size"] == 1 and saved["ranks"] == old["ranks"]


class _Planted:
    """A pickle whose load runs code: it creates the file `marker`."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_planted_checkpoint_is_never_unpickled(tmp_path, capsys):
    """A checkpoint whose dcp/.metadata is a malicious pickle, its manifest's sums recomputed as an
    attacker would (signature kept, or dropped): skipped with one warning before any read; the
    signed one before it is used. A key of someone else's or readable by others is refused."""
    import pickle

    from rarelm.train.dist import Dist

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    store = CheckpointStore(tmp_path / "cache", run_key({"a": 1}, []))
    for step in (1, 2):
        store.save(step, model, optimizer, {"step": step}, Dist())
    key = tmp_path / "cache" / ".signing-key"
    assert key.stat().st_mode & 0o777 == 0o600 and key.stat().st_size == 32
    marker = tmp_path / "code-ran"
    newest = store.dir / "step-00000002"
    metadata = newest / "dcp" / ".metadata"
    metadata.write_bytes(pickle.dumps(_Planted(marker)))
    manifest = json.loads((newest / "manifest.json").read_text())
    manifest["sha256"]["dcp/.metadata"] = hashlib.sha256(metadata.read_bytes()).hexdigest()
    for forged in (manifest, {k: v for k, v in manifest.items() if k != "hmac"}):
        (newest / "manifest.json").write_text(json.dumps(forged))
        best = store.latest_valid()
        assert best is not None and best.name == "step-00000001"
        warning = capsys.readouterr().err.strip().splitlines()
        assert len(warning) == 1 and "skipping corrupt checkpoint" in warning[0], warning
        assert "not written by a run of this cache" in warning[0]
        fresh = torch.nn.Linear(3, 2)
        store.load_weights(best, fresh, torch.optim.AdamW(fresh.parameters(), lr=0.1))
        assert not marker.exists()
    pickle.loads(metadata.read_bytes())  # the planted file would have run code
    assert marker.exists()
    key.chmod(0o644)
    with pytest.raises(RarelmError, match=r"checkpoint key .*\.signing-key: must be a 32-byte file of "
                                          r"your own with mode 0600 \(it is uid \d+, mode 644"):
        store.latest_valid()


# --------------------------------------------------------------------------- real runs

@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_raw):
    """The tiny pipeline through `dvc repro train` (2 DDP workers); its own MLflow store."""
    root = train_repo(tmp_path_factory.mktemp("train") / "repo", tiny_raw)
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{root / 'test-mlflow.db'}",
           "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "1"}
    result = run(["dvc", "repro", "train"], root, env=env, check=True)
    return root, env, result


def _train_cli(out: str) -> list[str]:
    """Options that send a stage run's outputs beside the DVC-tracked ones."""
    return ["--out", f"models/{out}", "--metrics", f"metrics/{out}.json",
            "--plots", f"plots/{out}.csv", "--no-progress"]


def test_dvc_repro_trains_with_two_ddp_processes(trained):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root, env, result = trained
    assert "Running stage 'train'" in result.stdout
    summary = [line for line in result.stdout.splitlines() if line.startswith("train: ")]
    assert len(summary) == 1 and "300 steps" in summary[0], result.stdout
    assert "step 300/300 | loss" in result.stderr  # log lines go to stderr
    # each ends with the time so far and, but at the last step, the time left (issue 57)
    steps = [line for line in result.stderr.splitlines() if line.startswith("step ")]
    assert len(steps) >= 3 and steps[-1].startswith("step 300/300 | ")
    so_far = r"\| [0-9]+(\.[0-9] s| min [0-9]+ s| h [0-9]{2} min)"
    assert all(re.search(so_far + r", about [0-9].* left$", line) for line in steps[:-1]), steps
    assert re.search(so_far + "$", steps[-1]), steps[-1]
    metrics = json.loads((root / "metrics/train.json").read_text())
    assert set(metrics) - PROBE_KEYS == METRIC_KEYS and all(v is not None for v in metrics.values())
    if not metrics["precision_reason"].startswith("probe"):  # as RARELM_CPU_BF16 says, if set
        auto = pick_precision("auto", torch.device("cpu"))[0]
        assert metrics["precision"] == ("bf16" if auto is torch.bfloat16 else "fp32")
    assert f"tokens/s ({metrics['precision']}: {metrics['precision_reason']})" in summary[0]
    assert f"train: precision {metrics['precision']} ({metrics['precision_reason']}" in result.stderr
    assert f"fp32 products by {metrics['matmul']} ({metrics['matmul_reason']})" in result.stderr
    # 2 ranks x 4 samples x 32 tokens per step
    assert metrics["steps"] == 300 and metrics["tokens"] == 300 * 2 * 4 * 32
    assert metrics["val_ce"] < 5.0  # it learned: the tiny corpus's unigram entropy is ~5.3
    rows = list(csv.DictReader((root / "plots/train.csv").open()))
    assert [int(r["step"]) for r in rows] == [50, 100, 150, 200, 250, 300]
    assert float(rows[-1]["ce"]) < float(rows[0]["ce"])
    assert rows[2]["val_ce"] and not rows[1]["val_ce"]
    model = AutoModelForCausalLM.from_pretrained(root / "models/model")
    tokenizer = AutoTokenizer.from_pretrained(root / "models/model")
    assert model.config.n_layer == 1 and model.config.vocab_size == len(tokenizer)
    ids = tokenizer("The patient", return_tensors="pt").input_ids
    assert model(input_ids=ids).logits.shape[-1] == len(tokenizer)
    # a finished run leaves no checkpoint, only the cache's signing key
    assert [p.name for p in (root / ".cache/train").iterdir()] == [".signing-key"]
    # a second `dvc repro` has nothing to do
    assert "Stage 'train' didn't change, skipping" in run(["dvc", "repro", "train"], root,
                                                          env=env, check=True).stdout


def test_mlflow_run_holds_params_step_metrics_tags_and_system_metrics(trained, tmp_path):
    import mlflow

    from rarelm.params import load_params

    root, env, _ = trained
    info = json.loads((root / "models/model/mlflow_run.json").read_text())
    assert info["tracking_uri"] == env["MLFLOW_TRACKING_URI"]
    assert info["experiment"] == "test-train"
    client = mlflow.MlflowClient(info["tracking_uri"])
    mlrun = client.get_run(info["run_id"])
    assert mlrun.info.status == "FINISHED"
    assert client.get_experiment(mlrun.info.experiment_id).name == "test-train"
    flat = load_params(root / "params.yaml").flat()
    assert set(mlrun.data.params) == set(flat)
    assert mlrun.data.params["train.max_steps"] == "300" and mlrun.data.params["alpha"] == "0.5"
    tags = mlrun.data.tags
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                            text=True).stdout.strip()
    assert tags["stage"] == "train" and tags["git_commit"] == commit
    trained_in = json.loads((root / "metrics/train.json").read_text())["precision"]
    assert tags["precision"] == trained_in and "final/precision" not in mlrun.data.metrics
    assert tags["matmul"] == json.loads((root / "metrics/train.json").read_text())["matmul"]
    assert "DVC_EXP_NAME" not in tags  # only under `dvc exp run`
    history = client.get_metric_history(info["run_id"], "train/loss")
    assert [m.step for m in history] == [50, 100, 150, 200, 250, 300]
    metrics = mlrun.data.metrics
    for key in ("train/ce", "train/rare_ce", "train/lr", "train/grad_norm", "train/tokens_per_s",
                "val/ce", "val/rare_ce", "summary/tokens_per_s"):
        assert key in metrics, key
    assert all(k.startswith(("train/", "val/", "summary/", "system/")) for k in metrics)
    final = json.loads(Path(client.download_artifacts(info["run_id"], "final/train.json", str(tmp_path)))
                       .read_text())  # metrics/train.json: an artifact, counts included, not metrics
    assert final == json.loads((root / "metrics/train.json").read_text())
    upstream = json.loads(Path(client.download_artifacts(info["run_id"], "upstream.json", str(tmp_path)))
                          .read_text())
    assert upstream["upstream/prepare/documents"] > 0 and "upstream/tokenize/vocab_size" in upstream
    note = mlrun.data.tags["mlflow.note.content"]  # the run's description: corpus, model, params
    trained_with = load_params(root / "params.yaml")  # the fixture's own params (seed 7, rare_weight 1)
    model, loss = trained_with.model, trained_with.loss
    assert mlrun.info.run_name == f"train-{commit[:7]}-demo_en-gpt2-{model.n_layer}x{model.n_embd}"
    assert note == (f"{mlrun.info.run_name} at commit {commit[:7]}; corpus data/raw/demo_en.txt.gz (en); "
                    f"model: GPT-2-style, {model.n_layer} layers x {model.n_embd}, from scratch; "
                    f"alpha {trained_with.alpha:g}, loss.rare_weight {loss.rare_weight:g}, loss.targets "
                    f"{loss.targets}, seed {trained_with.seed}, "
                    f"train.max_steps {trained_with.train.max_steps}; "
                    "changed from the commit's params.yaml: nothing. Read summary/ first.")
    assert {i.dataset.name for i in mlrun.inputs.dataset_inputs} == {
        "data/tokenized", "data/rare", "data/weights"}  # digests from dvc.lock
    (model,) = mlrun.outputs.model_outputs  # logged (tracking.log_model: auto), not registered
    assert not client.search_model_versions(f"name = 'rarelm' and run_id = '{info['run_id']}'")
    folder = root / "models/model"  # a complete Hugging Face folder (rarelm.tracking.export)
    assert json.loads((folder / "tokenizer_config.json").read_text())["model_max_length"] == 32
    assert json.loads((folder / "generation_config.json").read_text())["top_k"] == 50
    assert "| `alpha` | `0.5` |" in (folder / "README.md").read_text()
    assert any(k.startswith("system/cpu_utilization") for k in metrics), sorted(metrics)


def test_unreachable_tracking_store_warns_once_and_training_finishes(trained, tmp_path):
    root, _, _ = trained
    params = tmp_path / "params.yaml"
    shutil.copy(root / "params.yaml", params)
    set_params(tmp_path, **{"train.nproc": 1, "train.max_steps": 20, "tracking.required": False})
    env = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"}  # nothing listens on the discard port
    result = run([sys.executable, "-m", "stages.train", "--params", str(params),
                  *_train_cli("untracked")], root, env=env)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "warning" in line.lower()]
    assert len(warnings) == 1 and "MLflow tracking store http://127.0.0.1:9" in warnings[0]
    assert "going on without tracking" in warnings[0]
    metrics = json.loads((root / "metrics/untracked.json").read_text())
    assert set(metrics) - PROBE_KEYS == METRIC_KEYS and all(v is not None for v in metrics.values())
    assert not (root / "models/untracked/mlflow_run.json").exists()
    assert (root / "models/untracked/model.safetensors").is_file()

    set_params(tmp_path, **{"tracking.required": True})  # the default: one line, no output
    result = run([sys.executable, "-m", "stages.train", "--params", str(params),
                  *_train_cli("required")], root, env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("rarelm train: error: MLflow tracking store http://127.0.0.1:9 cannot log (")
    assert not (root / "models/required").exists() and not (root / "metrics/required.json").exists()


def test_bad_inputs_are_one_line_errors(trained, tmp_path):
    root, env, _ = trained
    weights = tmp_path / "weights"
    weights.mkdir()
    np.save(weights / "weights.npy", np.ones(3))
    result = run([sys.executable, "-m", "stages.train", "--weights", str(weights),
                  *_train_cli("bad")], root, env=env)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "weights.npy: float64 [3], expected float64 [" in result.stderr
    missing = run([sys.executable, "-m", "stages.train", "--rare", str(tmp_path / "nope"),
                   *_train_cli("bad")], root, env=env)
    assert missing.returncode == 2 and "run the rare_terms stage first" in missing.stderr
    assert not (root / "models/bad").exists()


def test_crashed_run_is_marked_failed(trained, tmp_path, monkeypatch):
    import mlflow

    from rarelm.objectives import objective as loss
    from rarelm.params import load_params
    from rarelm.train import loop as train

    root, _, _ = trained
    uri = f"sqlite:///{tmp_path / 'crash.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(root)
    params = load_params(root / "params.yaml")
    params = dataclasses.replace(params, train=dataclasses.replace(params.train, nproc=1))

    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(loss.Objective, "__call__", broken)  # every loss path goes through it
    paths = train.Paths(model=tmp_path / "model", metrics=tmp_path / "m.json",
                        plots=tmp_path / "p.csv", cache=tmp_path / "cache")
    with pytest.raises(RuntimeError, match="boom"):
        train.train(params, paths, progress=False)
    runs = mlflow.MlflowClient(uri).search_runs(
        [mlflow.MlflowClient(uri).get_experiment_by_name("test-train").experiment_id])
    assert [r.info.status for r in runs] == ["FAILED"]
    assert not (tmp_path / "model").exists()


# --------------------------------------------------------------------------- fine-tuning

@pytest.mark.parametrize("backend", ["mkl", "onednn"])
def test_precision_probe_times_fp32_through_the_products_fp32_training_runs(
        trained, monkeypatch, tmp_path, backend):
    """`auto`'s probe times its fp32 side as fp32 training runs (rarelm.train.matmul: the model's
    linear layers routed through oneDNN where that is the faster, forced here), and keeps the
    answers of the two backends apart in its cache."""
    from rarelm.train import matmul, setup
    from rarelm.train.inputs import Paths, load_inputs

    if backend == "onednn" and not matmul.onednn_available():
        pytest.skip("no oneDNN in this torch")
    root, _, _ = trained
    params = untracked_params(root, monkeypatch)
    monkeypatch.setenv(matmul.MATMUL_ENV, backend)
    timed = []

    def probe(model, x, y):
        layers = [m for m in model.modules() if type(m).__name__ in ("Conv1D", "Linear")]
        timed.append([hasattr(module, "_rarelm_plain_forward") for module in layers])
        return {"fp32": 0.2, "bf16": 0.3}

    monkeypatch.setattr(setup, "probe_seconds", probe)
    seconds = setup._probe(params, load_inputs(params, Paths()), torch.device("cpu"), tmp_path)
    assert seconds == {"fp32": 0.2, "bf16": 0.3}
    assert len(timed) == 1 and len(timed[0]) == 4 + 1  # the 4 Conv1D of its one block, the lm_head
    assert set(timed[0]) == {backend == "onednn"}
    written = list((tmp_path / "precision").glob("*.json"))
    monkeypatch.setenv(matmul.MATMUL_ENV, "mkl" if backend == "onednn" else "onednn")
    if matmul.onednn_available():  # the other backend: another key, timed again
        setup._probe(params, load_inputs(params, Paths()), torch.device("cpu"), tmp_path)
        assert len(timed) == 2 and len(list((tmp_path / "precision").glob("*.json"))) == 2
    assert len(written) == 1


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_grad_accumulation_and_checkpointing_match_one_big_batch(trained, tmp_path, monkeypatch,
                                                                 precision):
    """4 micro-batches of 2 = one batch of 8 (plain CE, no dropout), with or without
    gradient checkpointing: the same samples in the same order, the same mean loss. Each
    precision is pinned (whatever `auto` picks on this CPU) and held to its own tolerance:
    fp32 sums the same numbers in another order, so the weights agree to 1e-5; bf16 autocast
    rounds every matmul's inputs to 8 bits of mantissa, so micro-batches and one big batch
    differ by bf16 rounding, which AdamW's normalised steps carry into the weights (measured
    on an AVX512-BF16 CPU: 1.5% of the distance the weights moved, fp32 5e-6; losses 2e-6)."""
    from safetensors.torch import load_file

    from rarelm.artifacts.tokenized import TokenizedData
    from rarelm.train import loop as train
    from rarelm.train.model import build_model
    from rarelm.train.state import seed_everything

    root, _, _ = trained
    base = untracked_params(root, monkeypatch)
    base = dataclasses.replace(base, loss=dataclasses.replace(base.loss, rare_weight=0.0),
                               model=dataclasses.replace(base.model, dropout=0.0))
    weights, losses = {}, {}
    for name, batch, accum, ckpt in (("big", 8, 1, False), ("accum", 2, 4, False),
                                     ("accum-ckpt", 2, 4, True)):
        params = dataclasses.replace(base, train=dataclasses.replace(
            base.train, nproc=1, max_steps=3, batch_size=batch, grad_accum=accum,
            gradient_checkpointing=ckpt, log_every=1, eval_every=3, precision=precision))
        paths = train.Paths(model=tmp_path / name, metrics=tmp_path / f"{name}.json",
                            plots=tmp_path / f"{name}.csv", cache=tmp_path / "cache")
        metrics = train.train(params, paths, progress=False)
        assert metrics["tokens"] == 3 * 8 * 32 and metrics["precision"] == precision
        # the fp32 products' backend (rarelm.train.matmul): measured or forced in fp32 only
        assert metrics["matmul"] in ("mkl", "onednn")
        assert (metrics["matmul_reason"].startswith(("measured", "cached", "RARELM_MATMUL"))
                if precision == "fp32" else metrics["matmul"] == "mkl")
        weights[name] = load_file(tmp_path / name / "model.safetensors")
        losses[name] = [float(r["ce"]) for r in csv.DictReader(paths.plots.open())]
    seed_everything(base.seed)  # the initial weights, as train() builds them
    init = build_model(base.model, TokenizedData.open(root / "data/tokenized")).state_dict()
    moved = distance(weights["big"], init)
    assert moved > 0
    for name in ("accum", "accum-ckpt"):
        if precision == "fp32":
            assert losses[name] == pytest.approx(losses["big"], rel=1e-6), name
            for key, tensor in weights["big"].items():
                assert torch.allclose(weights[name][key], tensor, atol=1e-5), (name, key)
        else:
            assert losses[name] == pytest.approx(losses["big"], rel=1e-3), name
            assert distance(weights[name], weights["big"]) < 0.1 * moved, name
    if precision == "bf16":  # bf16 really ran: not the fp32 result to fp32 precision
        assert distance(weights["accum"], weights["big"]) > 1e-4 * moved


def test_alpha_schedule_run_resumes_bit_identical_mid_epoch(trained, tmp_path, monkeypatch):
    """weights.schedule decay (weights recomputed per epoch from scores.npy, windows shifted
    per epoch): a run that crashes after a checkpoint in the middle of its second epoch and is
    started again ends byte-identical to an uninterrupted one."""
    from rarelm.report import reprocheck
    from rarelm.train import inputs as train

    root, _, _ = trained
    base = untracked_params(root, monkeypatch)
    params = dataclasses.replace(
        base, alpha=0.8, weights=dataclasses.replace(base.weights, schedule="decay"),
        train=dataclasses.replace(base.train, nproc=1, max_steps=12, batch_size=64, log_every=1,
                                  eval_every=12, checkpoint_every=4, precision="fp32"))
    n_windows = (12672 - 1) // 32  # the tiny train split: 395 windows, so 12 steps ~ 2 epochs
    assert epochs_to_train(params.train, 1, n_windows) == 2
    assert train.load_inputs(params, train.Paths())[4] is not None  # it reads scores.npy

    # crashed after the step-8 checkpoint: epoch 1, 117 windows in
    whole_then_crashed_and_resumed(params, tmp_path, monkeypatch, crash_step=9)
    for name in ("model.safetensors", "config.json"):
        assert (tmp_path / "resumed" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()
    for name in ("resumed.csv", "resumed.json"):  # curves and metrics, wall clock aside
        same = reprocheck.without_wall_clock
        assert same(tmp_path / name) == same(tmp_path / name.replace("resumed", "whole")), name


def test_face_agg_focal_run_resumes_bit_identical(trained, tmp_path, monkeypatch):
    """FACE (refreshed from predictions every 3 steps) + AGG + focal: a run that crashes after
    its step-4 checkpoint and is started again ends byte-identical to an uninterrupted one."""
    from rarelm.train import inputs as train

    root, _, _ = trained
    base = untracked_params(root, monkeypatch)
    params = dataclasses.replace(
        base, loss=dataclasses.replace(base.loss, token_weight="face", face_source="predictions",
                                       face_refresh=3, agg=True, focal_gamma=1.0),
        train=dataclasses.replace(base.train, nproc=1, max_steps=7, batch_size=8, log_every=1,
                                  eval_every=7, checkpoint_every=4, precision="fp32"))
    assert Path("data/rare/counts.npy") in train.input_files(train.Paths(), params)

    whole_then_crashed_and_resumed(params, tmp_path, monkeypatch, crash_step=6)
    whole, resumed = (tmp_path / n / "model.safetensors" for n in ("whole", "resumed"))
    assert resumed.read_bytes() == whole.read_bytes()
    rows = lambda name: [r["loss"] for r in csv.DictReader((tmp_path / f"{name}.csv").open())]  # noqa: E731
    assert rows("resumed") == rows("whole")


def test_kl_base_unlikelihood_normalize_run_resumes_bit_identical(trained, tmp_path, monkeypatch):
    """The remedies of issue 22 together (KL to the frozen starting model, unlikelihood with
    previous-context negatives, term weights after a term's first token, divided by the number
    of targets): a run that crashes after its step-4 checkpoint and is started again ends
    byte-identical to an uninterrupted one (the base is copied again from the same start)."""

    root, _, _ = trained
    base = untracked_params(root, monkeypatch)
    params = dataclasses.replace(
        base, loss=dataclasses.replace(base.loss, targets="terms_after_first", rare_weight=2.0,
                                       normalize="targets", unlikelihood=0.5, kl_base=1.0),
        train=dataclasses.replace(base.train, nproc=1, max_steps=7, batch_size=8, log_every=1,
                                  eval_every=7, checkpoint_every=4, precision="fp32"))

    whole_then_crashed_and_resumed(params, tmp_path, monkeypatch, crash_step=6)
    whole, resumed = (tmp_path / n / "model.safetensors" for n in ("whole", "resumed"))
    assert resumed.read_bytes() == whole.read_bytes()
    rows = lambda name: [r["loss"] for r in csv.DictReader((tmp_path / f"{name}.csv").open())]  # noqa: E731
    assert rows("resumed") == rows("whole") and len(rows("whole")) == 7


def test_curves_of_a_run_resumed_between_two_rows_equal_the_uninterrupted_ones(trained, tmp_path,
                                                                               monkeypatch):
    """A checkpoint every 3 steps, a curve row every 4: crashed after the step-6 checkpoint, the
    resumed run's row of step 8 still averages steps 5-8 (the log window is in the checkpoint)."""
    from rarelm.report import reprocheck

    root, _, _ = trained
    base = untracked_params(root, monkeypatch)
    params = dataclasses.replace(base, train=dataclasses.replace(
        base.train, nproc=1, max_steps=10, batch_size=8, log_every=4, eval_every=10,
        checkpoint_every=3, precision="fp32"))
    whole_then_crashed_and_resumed(params, tmp_path, monkeypatch, crash_step=7)
    same = reprocheck.without_wall_clock
    assert [r["step"] for r in csv.DictReader((tmp_path / "whole.csv").open())] == ["4", "8", "10"]
    assert same(tmp_path / "resumed.csv") == same(tmp_path / "whole.csv")
    assert (tmp_path / "resumed/model.safetensors").read_bytes() == \
        (tmp_path / "whole/model.safetensors").read_bytes()


def test_non_finite_loss_stops_training_with_one_line_and_no_model(trained, tmp_path):
    """A pretrained model with a NaN weight (2 DDP ranks): the first step's loss and gradient
    norm are NaN; the run stops with one line naming the step, exit 2, no model or metrics."""
    from safetensors.torch import load_file, save_file

    root, _, _ = trained
    base = _tiny_pretrained(root, tmp_path / "base")
    weights = load_file(base / "model.safetensors")
    weights["transformer.ln_f.weight"][0] = float("nan")
    save_file(weights, base / "model.safetensors", metadata={"format": "pt"})
    result = _stage_run(root, tmp_path, "nan", **{"model.name_or_path": str(base),
                                                  "train.max_steps": 4, "train.log_every": 2,
                                                  "train.checkpoint_every": 2, "train.eval_every": 4})
    assert result.returncode == 2, result.stderr[-3000:]
    # one error line; the log's start line (`train: precision ...`) may come before it
    lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("train: ")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert lines[0].startswith("rarelm train: error: step 1: the loss or gradient norm is not finite")
    for name in ("model", "train.json", "train.csv"):
        assert not (tmp_path / "nan" / name).exists(), name
    assert not list((tmp_path / "nan" / "cache").glob("*/step-*"))  # no NaN checkpoint either


def test_save_dtype_float16_halves_the_weights_and_loaders_upcast(tmp_path):
    """model.save_dtype: float16 (the committed base): the file about half, one tied matrix, the
    values rounded to fp16; config.json still float32, so AutoModelForCausalLM loads float32."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

    from rarelm.train.saving import stored_weights

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=300, n_positions=16))
    model.save_pretrained(tmp_path / "full", state_dict=stored_weights(model, "float32"))
    model.save_pretrained(tmp_path / "half", state_dict=stored_weights(model, "float16"))
    full, half = (tmp_path / d / "model.safetensors" for d in ("full", "half"))
    assert 0.45 < half.stat().st_size / full.stat().st_size < 0.55
    stored = load_file(half)
    assert "lm_head.weight" not in stored and stored["transformer.wte.weight"].dtype == torch.float16
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "half")
    assert loaded.dtype == torch.float32
    assert torch.equal(loaded.transformer.h[0].mlp.c_fc.weight,
                       model.transformer.h[0].mlp.c_fc.weight.half().float())


def test_zero_steps_save_the_pretrained_model_as_it_is(trained, tmp_path):
    """train.max_steps 0 (README "Real text": the base model's row): no step, the same weights, one
    validation; what the evaluation of a base model without fine-tuning runs on."""
    from safetensors.torch import load_file

    root, _, _ = trained
    base = _tiny_pretrained(root, tmp_path / "base")
    result = _stage_run(root, tmp_path, "zero", **{"model.name_or_path": str(base), "train.max_steps": 0,
                                                   "tracking.log_model": False})
    assert result.returncode == 0, result.stderr[-3000:]
    before = load_file(base / "model.safetensors")
    after = load_file(tmp_path / "zero" / "model" / "model.safetensors")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    metrics = json.loads((tmp_path / "zero" / "train.json").read_text())
    assert (metrics["steps"], metrics["tokens"], metrics["epochs"]) == (0, 0, 0.0)
    assert metrics["val_ce"] > 0 and metrics["val_ppl"] == pytest.approx(math.exp(metrics["val_ce"]))


def test_pretrained_model_must_share_the_tokenizer(trained, tmp_path):
    from transformers import AutoTokenizer, DistilBertConfig, DistilBertModel, GPT2LMHeadModel

    from rarelm.artifacts.tokenized import TokenizedData
    from rarelm.params import ModelParams
    from rarelm.train.model import gpt2_config, load_pretrained

    root, _, _ = trained
    data = TokenizedData.open(root / "data/tokenized")
    good = tmp_path / "good"
    GPT2LMHeadModel(gpt2_config(ModelParams(n_layer=1, n_head=2, n_embd=32, block_size=64),
                                data.vocab_size, data.eot_id)).save_pretrained(good)
    AutoTokenizer.from_pretrained(data.tokenizer_dir).save_pretrained(good)
    model = load_pretrained(ModelParams(name_or_path=str(good), block_size=32), data)
    assert model.get_input_embeddings().num_embeddings == data.vocab_size

    with pytest.raises(RarelmError, match="must be <= 64"):
        load_pretrained(ModelParams(name_or_path=str(good), block_size=128), data)

    other = tmp_path / "other"
    shutil.copytree(good, other)
    vocab = json.loads((other / "tokenizer.json").read_text())
    first = next(iter(vocab["model"]["vocab"]))
    vocab["model"]["vocab"]["zz-not-ours"] = vocab["model"]["vocab"].pop(first)
    (other / "tokenizer.json").write_text(json.dumps(vocab))
    with pytest.raises(RarelmError, match="is not the one tokenize used"):
        load_pretrained(ModelParams(name_or_path=str(other), block_size=32), data)

    encoder = tmp_path / "encoder"
    DistilBertModel(DistilBertConfig(vocab_size=data.vocab_size, dim=32, n_layers=1, n_heads=2,
                                     hidden_dim=64)).save_pretrained(encoder)
    with pytest.raises(RarelmError, match="not a causal LM"):
        load_pretrained(ModelParams(name_or_path=str(encoder), block_size=32), data)
    with pytest.raises(RarelmError, match="no such folder"):
        load_pretrained(ModelParams(name_or_path=str(tmp_path / "nope"), block_size=32), data)


# --------------------------------------------------------------------------- FSDP and LoRA

def _stage_run(root: Path, tmp_path: Path, name: str, **overrides) -> subprocess.CompletedProcess:
    """The train stage with params.yaml + overrides, its outputs and checkpoints under tmp_path."""
    folder = tmp_path / name
    folder.mkdir()
    shutil.copy(root / "params.yaml", folder / "params.yaml")
    set_params(folder, **overrides)
    return run([sys.executable, "-m", "stages.train", "--params", str(folder / "params.yaml"),
                "--out", str(folder / "model"), "--metrics", str(folder / "train.json"),
                "--plots", str(folder / "train.csv"), "--cache", str(folder / "cache"),
                "--no-progress"], root, env={"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'm.db'}"})


def test_fsdp_trains_as_ddp_does_with_half_the_state_per_rank(trained, tmp_path):
    """The same params under DDP and FSDP2 (2 ranks, fp32), with the rare-aware objectives, the
    weighted sampler, gradient accumulation and activation checkpointing on: the same loss curve
    and weights within float rounding, and FSDP holds about half the parameter + gradient +
    AdamW bytes per rank."""
    from safetensors.torch import load_file

    root, _, _ = trained
    common = {"train.max_steps": 8, "train.log_every": 1, "train.eval_every": 8,
              "train.checkpoint_every": 100, "train.precision": "fp32", "loss.targets": "both",
              "loss.token_weight": "face", "loss.face_source": "predictions", "loss.face_refresh": 2,
              "loss.agg": True, "loss.focal_gamma": 1.0, "train.grad_accum": 2,
              "train.gradient_checkpointing": True, "tracking.log_model": False}
    metrics, losses, weights = {}, {}, {}
    for strategy in ("ddp", "fsdp"):
        result = _stage_run(root, tmp_path, strategy, **common, **{"train.strategy": strategy})
        assert result.returncode == 0, result.stderr[-3000:]
        metrics[strategy] = json.loads((tmp_path / strategy / "train.json").read_text())
        rows = csv.DictReader((tmp_path / strategy / "train.csv").open())
        losses[strategy] = [float(r["loss"]) for r in rows]
        weights[strategy] = load_file(tmp_path / strategy / "model" / "model.safetensors")
    assert len(losses["fsdp"]) == 8 and losses["fsdp"][-1] < losses["fsdp"][0]
    assert losses["fsdp"] == pytest.approx(losses["ddp"], rel=1e-5)
    for key, tensor in weights["ddp"].items():
        assert torch.allclose(weights["fsdp"][key], tensor, atol=1e-5), key
    assert metrics["fsdp"]["parameters"] == metrics["ddp"]["parameters"]
    ratio = metrics["fsdp"]["state_bytes_per_rank"] / metrics["ddp"]["state_bytes_per_rank"]
    assert 0.45 < ratio <= 0.55, ratio


def _tiny_pretrained(root: Path, folder: Path) -> Path:
    """The model the `trained` fixture trained, as a "pretrained" folder (tokenizer included)."""
    shutil.copytree(root / "models/model", folder, ignore=shutil.ignore_patterns("mlflow_run.json"))
    return folder


def test_lora_fine_tune_under_fsdp_saves_a_merged_model_and_records_what_trained(trained, tmp_path):
    import mlflow
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    root, _, _ = trained
    base = _tiny_pretrained(root, tmp_path / "base")
    # under FSDP (LoRA in one process: tests/test_lora.py; under torchrun's DDP: the CPU run of
    # bench/gpu_check.sh): the adapters are sharded like any weight, then gathered and merged
    lora = {"model.name_or_path": str(base), "model.lora.rank": 4, "model.lora.alpha": 8.0,
            "train.strategy": "fsdp", "train.max_steps": 6, "train.log_every": 1, "train.eval_every": 6,
            "train.checkpoint_every": 3, "train.lr": 0.01, "tracking.log_model": False}
    result = _stage_run(root, tmp_path, "lora", **lora)
    assert result.returncode == 0, result.stderr[-3000:]
    out = tmp_path / "lora" / "model"
    metrics = json.loads((tmp_path / "lora" / "train.json").read_text())
    # GPT-2's c_attn (32 -> 96) in 1 layer: A 4 x 32 + B 96 x 4 = 512 adapter weights
    assert metrics["trainable_parameters"] == 512
    before = load_file(base / "model.safetensors")
    assert metrics["parameters"] == sum(t.numel() for k, t in before.items() if k != "lm_head.weight") + 512
    # the merged model: only the adapted weights changed, and it loads as a plain causal LM
    after = load_file(out / "model.safetensors")
    changed = sorted(k for k in before if not torch.equal(before[k], after[k]))
    assert changed == ["transformer.h.0.attn.c_attn.weight"]
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base),
                                        out / "adapter").eval()
    ids = torch.randint(0, merged.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, adapted(ids).logits, atol=1e-5)
    # MLflow records what trained against the whole model
    info = json.loads((out / "mlflow_run.json").read_text())
    logged = mlflow.MlflowClient(info["tracking_uri"]).get_run(info["run_id"]).data
    counts = json.loads(Path(mlflow.MlflowClient(info["tracking_uri"]).download_artifacts(
        info["run_id"], "final/train.json", str(tmp_path))).read_text())  # an artifact, not a metric
    assert counts["trainable_parameters"] == 512 and "final/trainable_parameters" not in logged.metrics
    assert logged.params["model.lora.rank"] == "4"


@pytest.mark.parametrize(("overrides", "message"), [
    ({"train.strategy": "fsdp", "train.nproc": 1},
     "train.strategy = 'fsdp' is not allowed with 1 process"),
    ({"train.strategy": "zero3"}, "train.strategy = 'zero3' is not allowed (must be one of ddp, fsdp)"),
    ({"model.lora.rank": 4}, "model.lora.rank = 4 is not allowed without a pretrained model"),
    ({"model.lora.rank": 4, "model.lora.target_modules": ["q_proj", "v_proj"], "model.name_or_path": "BASE"},
     "this 'gpt2' model has no module named 'q_proj' (its linear layers: c_attn, c_fc, c_proj, lm_head)"),
    ({"model.lora.rank": 4, "loss.agg": True, "model.name_or_path": "BASE"},
     "loss.agg = true is not allowed with model.lora"),
])
def test_bad_strategy_and_lora_params_are_one_line_errors(trained, tmp_path, overrides, message):
    root, _, _ = trained
    if overrides.get("model.name_or_path") == "BASE":  # a copy: the parametrized dict stays as is
        overrides = {**overrides, "model.name_or_path": str(_tiny_pretrained(root, tmp_path / "base"))}
    result = _stage_run(root, tmp_path, "bad", **overrides)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert lines[0].startswith("rarelm train: error: params: ") and message in lines[0], lines[0]
    assert not (tmp_path / "bad" / "model").exists()


# --------------------------------------------------------------------------- GPU check

def test_gpu_check_falls_back_to_cpu_without_a_gpu(tmp_path):
    env = {"CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    result = run(["bash", "bench/gpu_check.sh"], REPO, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("gpu_check: no CUDA device here: running the CPU fallback")
    summary = json.loads(lines[-1])
    assert summary["gpu"] is False and summary["device"] == "cpu"
    assert summary["tokens_per_s"] > 0 and 0 < summary["mfu"] < 1
    first, last = summary["bf16_loss_first_last"]
    assert math.isfinite(first) and last < first  # it trained
    assert summary["fp16_loss_first_last"] is None  # fp16 + GradScaler: CUDA only
    assert summary["fsdp_loss_first_last"] is None  # the suite runs FSDP over gloo itself
    # LoRA (rank 8 on c_attn of run 1's 1-layer, width-32 model): A 8 x 32 + B 96 x 8
    assert summary["lora_trainable_parameters"] == 8 * 32 + 96 * 8
    assert summary["lora_state_bytes_per_rank"] < summary["bf16_state_bytes_per_rank"] / 2
    assert all(map(math.isfinite, summary["lora_loss_first_last"]))
    profile = summary["profile"]  # bench/train_step_profile.py: our step profiled, the Trainer beside it
    assert profile["ours_tokens_per_s"] > 0 and profile["trainer_tokens_per_s"] > 0
    assert profile["syncs_per_step"] == 0, profile["sync_sites"]  # host reads, on a CPU too
    assert profile["loss_chunked"] is True
    assert not list(tmp_path.glob("gpu_check.*"))  # its work folder is cleaned up
