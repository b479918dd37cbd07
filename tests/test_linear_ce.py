"""The chunked output layer + cross-entropy (rarelm/objectives/linear_ce.py, hidden.py): the same
per-token losses and gradients as the full logits with F.cross_entropy, and every objective the
same from the hidden states as from the logits.

Tolerances: fp32 sums the same products in another order: losses to 1e-6 and gradients to 1e-5
of their largest entry. bf16 (the matmuls' inputs rounded to 8 bits of mantissa, as autocast
runs the output layer): the per-token losses agree to 1e-6 (the logits are the same bf16
products, the softmax fp32 in both), the gradients to 2% of their largest entry, since the full
path rounds each [V, d] weight gradient once to bf16 after one long sum while the chunked one
adds bf16 chunk products in fp32.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from rarelm.objectives import linear_ce
from rarelm.objectives.hidden import HiddenStates
from rarelm.objectives.linear_ce import chunk_rows, linear_cross_entropy
from tests.helpers import objective_of

GRAD_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
N, D, V = 300, 16, 97  # 300 tokens in chunks of 64: four full chunks and a partial one


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(N, D, generator=g), torch.randn(V, D, generator=g) * 0.3,
            torch.randint(0, V, (N,), generator=g), torch.rand(N, generator=g),
            torch.randn(V, generator=g))


def _close(ours: torch.Tensor, theirs: torch.Tensor, rel: float) -> bool:
    return bool((ours - theirs).abs().max() <= rel * theirs.abs().max())


@pytest.mark.parametrize("align", [1, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("use", ["weighted", "weighted+bias", "weighted+wide bias", "ce", "ce+lse"])
def test_losses_and_gradients_equal_the_full_logits(dtype, use, align, monkeypatch):
    """weighted: sum(coef * ce) with its gradients made in the forward (with a bias: logit
    adjustment); ce / ce+lse: a nonlinear use of the per-token losses (and log-sum-exp), the
    backward recomputing each chunk. align 64: the products padded to 128 vocabulary rows, as on a
    GPU (linear_ce.ALIGN), the padding's logits at -inf: the same losses and gradients."""
    monkeypatch.setitem(linear_ce.ALIGN, "cpu", align)
    hidden, weight, y, w, bias = _inputs()
    with_bias = "bias" in use
    bias = bias * 40 if "wide" in use else bias  # over e^60: the plain CE by a second logsumexp

    def loss_of(ce, lse, weighted):
        if use.startswith("weighted"):
            return weighted
        return (ce ** 2 * w).sum() + ((lse * w.flip(0)).sum() if use == "ce+lse" else 0)

    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    z = (h1.to(dtype) @ w1.to(dtype).t()).float()
    plain_ref = F.cross_entropy(z, y, reduction="none")
    z = z + bias if with_bias else z
    ce_ref = F.cross_entropy(z, y, reduction="none")
    loss_of(ce_ref, torch.logsumexp(z, -1), (ce_ref * w).sum()).backward()

    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ce, lse, plain, weighted = linear_cross_entropy(
        h2.to(dtype), w2.to(dtype), y, bias if with_bias else None,
        w if use.startswith("weighted") else None, chunk=64)
    loss_of(ce, lse, weighted).backward()

    assert torch.allclose(ce, ce_ref, rtol=1e-6, atol=1e-6)
    assert torch.allclose(plain, plain_ref, rtol=1e-6, atol=1e-6) and not plain.requires_grad
    assert _close(h2.grad, h1.grad, GRAD_TOLERANCE[dtype])
    assert _close(w2.grad, w1.grad, GRAD_TOLERANCE[dtype])


def test_by_hand_and_chunk_sizes():
    """logits 0 and ln 3 (softmax 0.25, 0.75), target 0: ce = lse = log 4; gradient of the
    hidden state = (p - onehot) @ weight = (0.75 ln 3, 0)."""
    h = torch.tensor([[1.0, 0.0]], requires_grad=True)
    w = torch.tensor([[0.0, 0.0], [float(np.log(3)), 0.0]], requires_grad=True)
    ce, lse, _, weighted = linear_cross_entropy(h, w, torch.tensor([0]), coef=torch.ones(1))
    weighted.backward()
    assert ce.item() == pytest.approx(np.log(4)) and lse.item() == pytest.approx(np.log(4))
    assert h.grad.flatten().tolist() == pytest.approx([0.75 * np.log(3), 0.0])
    assert w.grad.flatten().tolist() == pytest.approx([-0.75, 0.0, 0.75, 0.0])
    assert (chunk_rows(4096), chunk_rows(8192)) == (512, 256)


COUNTS = np.arange(1, V + 1) * 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("loss", [
    {}, {"rare_weight": 2.0}, {"targets": "terms", "rare_weight": 2.0, "normalize": "targets"},
    {"token_weight": "tlat_exp"}, {"token_weight": "face"}, {"focal_gamma": 2.0},
    {"logit_adjust_tau": 1.0}, {"unlikelihood": 1.0},
    {"token_weight": "face", "face_source": "predictions"},  # these three make the full logits
    {"frequent_unlikelihood": 1.0, "targets": "terms"}, {"logit_adjust_tau": 1.0, "unlikelihood": 0.5},
])
@pytest.mark.parametrize("align", [1, 64])
def test_every_objective_is_the_same_from_the_hidden_states(dtype, loss, align, monkeypatch):
    """Objective(HiddenStates(...)) against Objective(logits) on the same model output: the
    loss, the logged sums and the gradients, within the tolerances above; align 64 pads the
    vocabulary's products as on a GPU."""
    from rarelm.artifacts.term_index import TermIndex

    monkeypatch.setitem(linear_ce.ALIGN, "cpu", align)

    g = torch.Generator().manual_seed(1)
    b, t = 3, 20
    hidden, weight = torch.randn(b, t, D, generator=g), torch.randn(V, D, generator=g)
    x, y = torch.randint(0, V, (b, t), generator=g), torch.randint(0, V, (b, t), generator=g)
    is_rare, is_frequent = torch.arange(V) % 3 == 0, torch.arange(V) % 5 == 0
    index = TermIndex(np.array([[2, 2, 0], [30, 3, 1]]), max_length=3)
    starts = np.array([0, 20, 40])
    results = []
    for chunked in (False, True):
        objective = objective_of(is_rare, index, is_frequent=is_frequent, counts=COUNTS, **loss)
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        scores = HiddenStates(h, w, dtype) if chunked else F.linear(h.to(dtype), w.to(dtype))
        value, stats = objective(scores, y, starts, x)
        value.backward()
        results.append((value.detach(), stats, h.grad, w.grad))
    (full_loss, full_stats, full_h, full_w), (loss_, stats_, h_, w_) = results
    assert loss_.item() == pytest.approx(full_loss.item(), rel=1e-6)
    assert torch.allclose(stats_, full_stats, rtol=1e-6)
    assert _close(h_, full_h, GRAD_TOLERANCE[dtype]) and _close(w_, full_w, GRAD_TOLERANCE[dtype])


def test_which_objectives_need_the_full_logits():
    """Only those whose hooks have no chunked form: KL to the base, frequent-token unlikelihood,
    FACE from predictions, AGG, and logit adjustment together with a penalty."""
    def needs(**loss) -> bool:
        return objective_of(torch.zeros(V, dtype=torch.bool), counts=COUNTS, **loss).needs_logits

    assert not any(needs(**loss) for loss in (
        {}, {"rare_weight": 2.0}, {"token_weight": "tlat_chi2"}, {"token_weight": "face"},
        {"focal_gamma": 1.0}, {"logit_adjust_tau": 1.0}, {"unlikelihood": 1.0},
        {"normalize": "targets", "rare_weight": 1.0}))
    assert all(needs(**loss) for loss in (
        {"kl_base": 1.0}, {"frequent_unlikelihood": 1.0}, {"agg": True},
        {"token_weight": "face", "face_source": "predictions"},
        {"logit_adjust_tau": 1.0, "unlikelihood": 1.0}))
