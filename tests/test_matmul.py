"""The fp32 products by oneDNN (rarelm/train/matmul.py): the same layers, gradients and training
as torch's own (MKL) route within float rounding, deterministic, untouched under autocast; the
backend measured once per machine and cached, forced by RARELM_MATMUL.

Tolerance of the weights after N steps (AdamW, lr 1e-3, fp32, the chunked loss as the step runs
it): the distance between the oneDNN and the MKL run's weights within 1e-4 of the distance the
weights moved, as tests/test_output.py's bound for the chunked loss against the full logits.
Both accumulate in fp32; where a product sums over many rows (the weight gradients) in another
order, so the gradients agree to ~1e-7 relative, and AdamW's normalised steps carry that
rounding into the weights (most at the attention's key bias, whose true gradient is 0).
"""

from __future__ import annotations

import copy

import pytest
import torch

from rarelm.errors import RarelmError
from rarelm.train import matmul
from rarelm.train.output import output_layer
from tests.helpers import BLOCK, VOCAB, adamw_steps, distance, tiny_gpt2

pytestmark = pytest.mark.skipif(not matmul.onednn_available(), reason="no oneDNN in this torch")

@pytest.mark.parametrize("in_out", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_the_routed_layer_and_its_gradients_equal_torch_s(in_out, bias):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 40, 24, generator=g, requires_grad=True)
    shape = (24, 56) if in_out else (56, 24)  # Conv1D stores [in, out], nn.Linear [out, in]
    w = torch.randn(*shape, generator=g, requires_grad=True)
    b = torch.randn(56, generator=g, requires_grad=True) if bias else None
    up = torch.randn(3, 40, 56, generator=g)
    ours = matmul._Linear.apply(x, w, b, in_out)
    ours.backward(up)
    got = [ours.detach(), x.grad, w.grad] + ([b.grad] if bias else [])
    x.grad = w.grad = None
    if bias:
        b.grad = None
    theirs = (x @ w if in_out else x @ w.t()) + (b if bias else 0)
    theirs.backward(up)
    want = [theirs.detach(), x.grad, w.grad] + ([b.grad] if bias else [])
    for a, e in zip(got, want, strict=True):
        assert a.shape == e.shape
        assert torch.allclose(a, e, rtol=1e-5, atol=1e-5 * e.abs().max().item())


def test_a_routed_model_gives_the_same_logits_and_runs_its_own_forward_under_autocast():
    x = torch.randint(0, VOCAB, (2, BLOCK))
    plain, routed = tiny_gpt2(), tiny_gpt2()
    assert matmul.route_linear_layers(routed) == 2 * 4 + 1  # 4 Conv1D a block, the lm_head
    assert torch.allclose(routed(input_ids=x).logits, plain(input_ids=x).logits, atol=1e-5)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16: bit for bit the layers' own
        assert torch.equal(routed(input_ids=x).logits, plain(input_ids=x).logits)


def test_a_copy_of_a_routed_model_routes_its_own_layers():
    """copy.deepcopy (KL to the base copies the model) must not run the original's weights."""
    model = tiny_gpt2()
    matmul.route_linear_layers(model)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.lm_head.weight.zero_()  # tied: the copy's embeddings and output layer
    x = torch.randint(0, VOCAB, (1, BLOCK))
    assert twin(input_ids=x).logits.abs().max().item() == 0
    assert model(input_ids=x).logits.abs().max().item() > 0


def _weights_after(backend: str) -> dict[str, torch.Tensor]:
    """5 AdamW steps on 16 fixed random windows a step in fp32, the chunked loss, as the step runs
    it (256 tokens: sums over as many rows, where the two backends' orders differ)."""
    model = tiny_gpt2()
    if backend == "onednn":
        matmul.route_linear_layers(model)
    output = output_layer(model, chunked=True, mm=lambda a, b: matmul.mm(a, b, backend))
    assert output.chunked
    return adamw_steps(model, output, windows=16, rare_weight=2.0)


def test_weights_after_n_steps_equal_mkl_s_and_two_onednn_runs_are_bit_identical():
    start = tiny_gpt2().state_dict()
    mkl, onednn, again = _weights_after("mkl"), _weights_after("onednn"), _weights_after("onednn")
    moved = distance(mkl, start)
    assert moved > 1e-3
    # measured 8.4e-6 of the distance moved here on an AMD EPYC; 4.5e-5 at the demo's shape (4 x 128,
    # vocabulary 1,712, 16 x 128 tokens, lr 3e-3, 5 steps), its losses equal to 8 digits; on an
    # Intel Xeon (AMX) the two libraries' products agree bit for bit (0)
    assert distance(onednn, mkl) < 1e-4 * moved
    assert all(torch.equal(onednn[k], again[k]) for k in onednn)


def test_the_backend_is_measured_once_then_cached_and_can_be_forced(tmp_path, monkeypatch):
    monkeypatch.delenv(matmul.MATMUL_ENV, raising=False)
    calls = []

    def probe(shapes, rows=matmul.PROBE_ROWS, reps=matmul.PROBE_REPS):
        calls.append(shapes)
        return {"mkl": 0.2, "onednn": 0.1}

    monkeypatch.setattr(matmul, "probe_seconds", probe)
    cpu, model, waited = torch.device("cpu"), tiny_gpt2(), []
    first = matmul.pick_backend(model, cpu, tmp_path, before_probe=lambda: waited.append(1))
    second = matmul.pick_backend(model, cpu, tmp_path, before_probe=lambda: waited.append(1))
    assert first[0] == second[0] == "onednn" and len(calls) == 1 and len(waited) == 1
    assert calls[0] == [(32, 96), (32, 32), (32, 128), (128, 32), (32, VOCAB)]
    assert first[1].startswith("measured") and second[1].startswith("cached")
    assert matmul.pick_backend(model, cpu, tmp_path, eligible=False)[0] == "mkl"  # autocast, FSDP
    monkeypatch.setenv(matmul.MATMUL_ENV, "mkl")
    assert matmul.pick_backend(model, cpu, tmp_path) == ("mkl", "RARELM_MATMUL=mkl")
    monkeypatch.setenv(matmul.MATMUL_ENV, "blas")
    with pytest.raises(RarelmError, match="RARELM_MATMUL = 'blas' is not allowed"):
        matmul.pick_backend(model, cpu, tmp_path)


def test_the_probe_times_both_backends_on_the_layer_shapes():
    seconds = matmul.probe_seconds([(16, 48)], rows=64, reps=1)
    assert set(seconds) == {"mkl", "onednn"} and all(s > 0 for s in seconds.values())


def test_a_lora_model_routes_its_inner_layers_and_its_adapters_learn_the_same():
    """peft wraps GPT-2's Conv1D in its own layer, which calls the base layer and the adapters'
    nn.Linears: those are routed, the wrapper keeps its forward."""
    from rarelm.params import LoraParams
    from rarelm.train import lora

    model = lora.apply(tiny_gpt2(), LoraParams(rank=4))
    with torch.no_grad():  # B starts at 0: give the adapters an output and A a gradient
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_()
    routed = copy.deepcopy(model)
    assert matmul.route_linear_layers(routed) == 2 * (4 + 2) + 1  # + lora_A, lora_B a block
    x = torch.randint(0, VOCAB, (4, BLOCK))
    for m in (model, routed):
        m(input_ids=x).logits.square().mean().backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    theirs = {n: p.grad for n, p in routed.named_parameters() if p.grad is not None}
    assert sorted(grads) == sorted(theirs) and len(grads) == 4  # lora_A, lora_B of 2 blocks
    for name, grad in grads.items():
        assert torch.allclose(theirs[name], grad, atol=1e-4 * grad.abs().max().item()), name


def test_an_output_layer_gated_by_agg_keeps_its_gate():
    """loss.agg rewires the output layer's forward (its weight gradient gated) before the routing:
    routing it would skip the gate, so it is left as it is; the other layers are routed. (It was
    routed once: AGG then did nothing in fp32 where oneDNN won, and DDP left FSDP's losses by 1.2%.)"""
    from rarelm.objectives.agg import AdaptiveGradientGate

    model = tiny_gpt2()
    gate = AdaptiveGradientGate(VOCAB, alpha=0.2, memory=4)
    gate.prepare_model(model)
    gated_forward = model.lm_head.forward
    assert matmul.route_linear_layers(model) == 2 * 4  # the blocks' Conv1D only
    assert model.lm_head.forward is gated_forward and not hasattr(model.lm_head, "_rarelm_plain_forward")
