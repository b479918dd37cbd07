"""The training objectives (rarelm/objectives/): which targets count more, by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rarelm.artifacts.term_index import TermIndex
from rarelm.objectives.agg import AdaptiveGradientGate
from rarelm.objectives.rare_weight import rare_weighted_loss
from tests.helpers import objective_of


def logits_with_ce(targets: list[int], ce: list[float], vocab: int = 5) -> torch.Tensor:
    """Logits [1, T, vocab] whose cross-entropy at target j is exactly ce[j]."""
    logits = torch.full((1, len(targets), vocab), -1e4)
    for j, (t, c) in enumerate(zip(targets, ce, strict=True)):
        logits[0, j, t] = 0.0
        logits[0, j, vocab - 1] = math.log(math.exp(c) - 1)  # p(target) = 1 / (1 + e^c - 1)
    return logits


# targets at positions 1..3 of a window starting at 0: ce 1, 3, 2; token 1 is rare;
# one term occurrence covers positions 2 and 3 (the second and third targets)
Y = torch.tensor([[0, 1, 2]])
CE = [1.0, 3.0, 2.0]
IS_RARE = torch.tensor([False, True, False, False, False])
INDEX = TermIndex(np.array([[2, 2, 0]]), max_length=2)


def _by(targets: str, rare_weight: float, index=None):
    """The objective of `loss.targets` and `loss.rare_weight` alone over IS_RARE."""
    return objective_of(IS_RARE, index, targets=targets, rare_weight=rare_weight)


@pytest.mark.parametrize(("targets", "expected"), [
    ("rare_bucket", (1 * 1.0 + 3 * 3.0 + 1 * 2.0) / (1 + 3 + 1)),  # 2.4
    ("terms", (1 * 1.0 + 3 * 3.0 + 3 * 2.0) / (1 + 3 + 3)),       # 16 / 7
    ("both", (1 * 1.0 + 3 * 3.0 + 3 * 2.0) / (1 + 3 + 3)),
])
def test_each_target_choice_by_hand(targets, expected):
    loss, stats = _by(targets, 2.0, INDEX)(logits_with_ce([0, 1, 2], CE), Y, np.array([0]))
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    # the logged sums are those of the rare bucket, whatever is weighted
    assert stats.tolist() == pytest.approx([6.0, 3.0, 3.0, 1.0], rel=1e-6)


def test_both_is_the_union_of_rare_targets_and_term_targets():
    y = torch.tensor([[1, 0, 0], [0, 1, 0]])
    starts = np.array([0, 5])  # the term covers positions 2 and 3: targets 1, 2 of the first window only
    masks = {t: _by(t, 1.0, INDEX).selected(y, starts).tolist()
             for t in ("rare_bucket", "terms", "both")}
    assert masks == {"rare_bucket": [[True, False, False], [False, True, False]],
                     "terms": [[False, True, True], [False, False, False]],
                     "both": [[True, True, True], [False, True, False]]}


def test_a_term_across_the_window_edge_counts_where_its_tokens_are():
    index = TermIndex(np.array([[3, 3, 0]]), max_length=3)  # positions 3, 4, 5
    mask = _by("terms", 1.0, index).selected(torch.zeros(2, 3, dtype=torch.long),
                                                            np.array([0, 3]))
    assert mask.tolist() == [[False, False, True], [True, True, False]]  # targets 1-3, then 4-6


def test_rare_weight_zero_ignores_the_targets_choice():
    logits = logits_with_ce([0, 1, 2], CE)
    plain, _ = rare_weighted_loss(logits, Y, IS_RARE, 0.0)
    for targets in ("rare_bucket", "terms", "both"):
        loss, _ = _by(targets, 0.0, INDEX)(logits, Y, np.array([0]))
        assert loss.item() == pytest.approx(plain.item()) == pytest.approx(2.0)


@pytest.mark.parametrize(("targets", "rare_weight"), [("rare_bucket", 0.0), ("rare_bucket", 2.0),
                                                   ("terms", 2.0), ("both", 0.5)])
def test_the_objective_is_its_oracle_where_only_the_rare_weight_is_on(targets, rare_weight):
    """`rare_weighted_loss`, the plain weighted loss, is the objective's oracle: with no remedy on
    beyond `loss.rare_weight`, the objective's full-logits path gives the same loss, logged sums and
    gradients, bit for bit."""
    g = torch.Generator().manual_seed(3)
    y, starts = torch.randint(0, 5, (2, 3), generator=g), np.array([0, 1])
    logits = torch.randn(2, 3, 5, generator=g)
    a, b = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    objective = _by(targets, rare_weight, INDEX)
    loss, stats = objective(a, y, starts)
    selected = objective.selected(y, starts) if rare_weight else None
    oracle, oracle_stats = rare_weighted_loss(b, y, IS_RARE, rare_weight, selected)
    loss.backward()
    oracle.backward()
    assert torch.equal(loss, oracle) and torch.equal(stats, oracle_stats)
    assert torch.equal(a.grad, b.grad)


def test_terms_need_the_index():
    with pytest.raises(ValueError, match="needs the term index"):
        _by("terms", 1.0)


# --------------------------------------------------------------------------- the published objectives

def _objective(counts=None, targets="rare_bucket", rare_weight=0.0, index=None, **loss):
    return objective_of(IS_RARE, index, is_frequent=torch.tensor([True, False, False, False, True]),
                        counts=counts, targets=targets, rare_weight=rare_weight, **loss)


COUNTS = np.array([1, 2, 4, 0, 0])  # seen tokens' median 2: c = 0.5, 1, 2


def test_tlat_weights_the_loss_by_hand():
    # exp, A = 1, T = 1: w = 1 + exp(-c) / exp(-0.5) for the targets 0, 1, 2
    w = [1 + math.exp(-c) / math.exp(-0.5) for c in (0.5, 1.0, 2.0)]
    objective = _objective(COUNTS, token_weight="tlat_exp", tlat_a=1.0, tlat_t=1.0)
    loss, stats = objective(logits_with_ce([0, 1, 2], CE), Y, np.array([0]))
    assert loss.item() == pytest.approx(sum(a * b for a, b in zip(w, CE, strict=True)) / sum(w), rel=1e-6)
    assert stats.tolist() == pytest.approx([6.0, 3.0, 3.0, 1.0], rel=1e-6)  # plain CE, as logged
    # chi-square composes with rare_weight 2 on the rare target (token 1): weights times (1, 3, 1)
    chi = [1 + c * c * math.exp(-c) / (4 * math.exp(-2)) for c in (0.5, 1.0, 2.0)]
    chi[1] *= 3
    loss, _ = _objective(COUNTS, rare_weight=2.0, token_weight="tlat_chi2", tlat_a=1.0,
                         tlat_t=1.0)(logits_with_ce([0, 1, 2], CE), Y, np.array([0]))
    assert loss.item() == pytest.approx(sum(a * b for a, b in zip(chi, CE, strict=True)) / sum(chi), rel=1e-6)


def test_face_weights_the_loss_by_hand_then_refreshes_from_the_predictions():
    counts = np.array([6, 3, 1, 0, 0])  # RF .6 .3 .1 0 0 -> 0, .5, .833, 1, 1 -> times 5 / 3.333
    w = [x * 5 / (0.5 + 5 / 6 + 2) for x in (0.0, 0.5, 5 / 6)]
    objective = _objective(counts, token_weight="face", face_source="predictions", face_refresh=2)
    logits = logits_with_ce([0, 1, 2], CE)  # argmax: token 4 everywhere (the target's rival)
    loss, _ = objective(logits, Y, np.array([0]))
    assert loss.item() == pytest.approx((w[1] * 3.0 + w[2] * 2.0) / (w[1] + w[2]), rel=1e-6)
    reduced = []
    objective.step_end(1, type("Dist", (), {"all_reduce": lambda self, t: reduced.append(t.clone())})())
    assert reduced[0].tolist() == [0, 0, 0, 0, 3]  # this rank's predictions, summed over ranks
    assert objective.face.counts.tolist() == [6, 3, 1, 0, 3]
    assert objective.face.weights[4].item() == pytest.approx(1 * 5 / (0.5 + 5 / 6 + 2))  # not yet
    objective(logits, Y, np.array([0]))
    objective.step_end(2)  # step 2: refreshed from counts 6, 3, 1, 0, 6
    assert objective.face.weights.tolist() == pytest.approx(
        (torch.tensor([0.0, 0.5, 5 / 6, 1.0, 0.0]) * 5 / (0.5 + 5 / 6 + 1)).tolist())
    restored = _objective(counts, token_weight="face", face_source="predictions", face_refresh=2)
    restored.load_state(objective.state())
    assert torch.equal(restored.face.counts, objective.face.counts)
    assert torch.equal(restored.face.weights, objective.face.weights)
    a, _ = restored(logits, Y, np.array([0]))
    b, _ = objective(logits, Y, np.array([0]))
    assert a.item() == b.item()


def test_face_counts_targets_from_the_train_counts_on():
    objective = _objective(np.array([6, 3, 1, 0, 0]), token_weight="face")
    objective(logits_with_ce([0, 1, 2], CE), Y, np.array([0]))
    objective.step_end(1)
    assert objective.face.counts.tolist() == [7, 4, 2, 0, 0]


def test_focal_by_hand():
    p = [math.exp(-c) for c in CE]
    expected = sum((1 - q) ** 2 * c for q, c in zip(p, CE, strict=True)) / 3
    loss, stats = _objective(focal_gamma=2.0)(logits_with_ce([0, 1, 2], CE), Y, np.array([0]))
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert stats[0].item() == pytest.approx(6.0, rel=1e-6)


def test_logit_adjustment_by_hand():
    # two tokens, equal logits; prior (add-one) of counts 2, 0: (3, 1) / 4 -> tau = 1 gives
    # softmax(log pi) = pi, so the loss of target 1 is -log 0.25 while plain CE logs log 2
    objective = objective_of(torch.tensor([False, True]), counts=np.array([2, 0]), logit_adjust_tau=1.0)
    loss, stats = objective(torch.zeros(1, 1, 2), torch.tensor([[1]]), np.array([0]))
    assert loss.item() == pytest.approx(math.log(4), rel=1e-6)
    assert stats.tolist() == pytest.approx([math.log(2), 1.0, math.log(2), 1.0], rel=1e-6)


def test_frequent_unlikelihood_by_hand_at_the_selected_targets():
    # probabilities .5 .3 .2 ... at each of two targets; token 0 (frequent) ranks above
    # target 2 (selected: a term position) but not above target 0; target 1 is not selected
    probs = torch.tensor([0.5, 0.3, 0.2, 1e-9, 1e-9])
    logits = torch.log(probs).expand(1, 3, 5).clone()
    y = torch.tensor([[0, 1, 2]])
    index = TermIndex(np.array([[1, 1, 0], [3, 1, 0]]), max_length=1)  # positions 1 and 3
    objective = _objective(targets="terms", index=index, frequent_unlikelihood=0.5)
    loss, _ = objective(logits, y, np.array([0]))
    ce = -torch.log(probs[[0, 1, 2]]).mean().item()
    assert loss.item() == pytest.approx(ce + 0.5 * -math.log(1 - 0.5) / 3, rel=1e-5)


def test_unlikelihood_pushes_down_the_previous_context_at_every_target_by_hand():
    # Welleck et al.'s token level: window x = 0 3 2 1, targets y = 3 2 1 3; p = .5 .3 .2 .0 .0
    # at every position (token 3's probability ~0: -log(1 - p) = 0 whatever the set holds)
    # C = {0}, {0, 3}, {0, 3, 2}, {0, 2, 1} (the context x_0..x_j minus the target y_j)
    probs = torch.tensor([0.5, 0.3, 0.2, 1e-9, 1e-9])
    logits = torch.log(probs).expand(1, 4, 5).clone()
    x, y = torch.tensor([[0, 3, 2, 1]]), torch.tensor([[3, 2, 1, 3]])
    ul = [-math.log(0.5), -math.log(0.5), -math.log(0.5) - math.log(0.8),
          -math.log(0.5) - math.log(0.8) - math.log(0.7)]
    ce = -torch.log(probs[[3, 2, 1, 3]]).mean().item()
    loss, stats = _objective(unlikelihood=2.0)(logits, y, np.array([0]), x)
    assert loss.item() == pytest.approx(ce + 2.0 * sum(ul) / 4, rel=1e-5)
    assert stats[0].item() == pytest.approx(4 * ce, rel=1e-6)  # the logged sums stay plain CE
    with pytest.raises(RuntimeError, match="needs the input ids"):
        _objective(unlikelihood=2.0)(logits, y, np.array([0]))


class _TableLM(torch.nn.Module):
    """A real torch model whose logits at a position are a table row of its input token."""

    def __init__(self, rows: list[list[float]]):
        super().__init__()
        self.table = torch.nn.Embedding.from_pretrained(torch.log(torch.tensor(rows)), freeze=False)

    def forward(self, input_ids, use_cache=False):
        return type("Out", (), {"logits": self.table(input_ids)})()


def test_kl_to_the_base_by_hand_on_the_unselected_targets_only():
    # base: p = (.5, .5) after every token; the model now says (.25, .75). Targets 1 and 2
    # are a term's (selected), target 0 is not: the penalty is kl_base * KL(base || model) / 3
    model = _TableLM([[0.5, 0.5], [0.5, 0.5]])
    objective = _objective(targets="terms", index=INDEX, kl_base=2.0)
    objective.prepare_model(model)
    with torch.no_grad():
        model.table.weight.copy_(torch.log(torch.tensor([[0.25, 0.75], [0.25, 0.75]])))
    x, y = torch.tensor([[0, 1, 0]]), torch.tensor([[1, 0, 1]])
    loss, stats = objective(model(x).logits, y, np.array([0]), x)
    kl = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)  # 0.1438
    ce = (-math.log(0.75) - math.log(0.25) - math.log(0.75)) / 3
    assert loss.item() == pytest.approx(ce + 2.0 * kl / 3, rel=1e-6)
    assert stats[0].item() == pytest.approx(3 * ce, rel=1e-6)
    assert objective.kl_base.base.table.weight.requires_grad is False  # frozen, in eval mode
    assert not objective.kl_base.base.training


def test_kl_to_the_base_is_zero_at_the_start_and_the_base_stays_frozen():
    model = _tiny_lm()
    objective = _objective(kl_base=1.0)
    objective.prepare_model(model)
    x = torch.tensor([[0, 1, 0, 2, 0, 3]])
    y = torch.tensor([[1, 0, 2, 0, 3, 0]])
    plain, _ = _by("rare_bucket", 0.0)(model(input_ids=x).logits, y, np.array([0]))
    loss, _ = objective(model(input_ids=x).logits, y, np.array([0]), x)
    assert loss.item() == pytest.approx(plain.item(), abs=1e-6)  # the model is its base
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=1.0).step()
    loss, _ = objective(model(input_ids=x).logits, y, np.array([0]), x)
    assert loss.item() > _by("rare_bucket", 0.0)(model(input_ids=x).logits, y,
                                                                np.array([0]))[0].item()
    assert torch.equal(objective.kl_base.base.lm_head.weight, _tiny_lm().lm_head.weight)


def test_normalize_by_the_number_of_targets_keeps_the_unselected_share_by_hand():
    # ce 1, 3, 2; the second and third targets are a term's; rare_weight 2: w = 1, 3, 3
    logits = logits_with_ce([0, 1, 2], CE)
    loss, _ = _objective(targets="terms", index=INDEX, rare_weight=2.0, normalize="targets")(
        logits, Y, np.array([0]))
    assert loss.item() == pytest.approx((1 * 1.0 + 3 * 3.0 + 3 * 2.0) / 3, rel=1e-6)  # not / 7
    plain, _ = _objective(normalize="targets")(logits, Y, np.array([0]))  # no weights: the mean
    assert plain.item() == pytest.approx(2.0, rel=1e-6)


def test_terms_after_first_weighs_a_term_past_its_first_token_by_hand():
    # one term occurrence covers targets 1 and 2: only target 2 is selected; ce 1, 3, 5
    ce = [1.0, 3.0, 5.0]
    loss, _ = _by("terms_after_first", 2.0, INDEX)(logits_with_ce([0, 1, 2], ce), Y,
                                                                 np.array([0]))
    assert loss.item() == pytest.approx((1.0 + 3.0 + 3 * 5.0) / 5, rel=1e-6)
    mask = _by("terms_after_first", 1.0, INDEX).selected(
        torch.zeros(2, 3, dtype=torch.long), np.array([0, 2]))
    # the second window starts mid-term: its first target (position 3) is the term's second token
    assert mask.tolist() == [[False, False, True], [True, False, False]]


@pytest.mark.parametrize("neutral", [{}, {"focal_gamma": 0.0, "logit_adjust_tau": 0.0, "unlikelihood": 0.0,
                                          "frequent_unlikelihood": 0.0, "kl_base": 0.0,
                                          "normalize": "weights"},
                                     {"token_weight": "tlat_exp", "tlat_a": 0.0}])
def test_neutral_settings_are_plain_cross_entropy_with_its_gradients(neutral):
    logits = torch.randn(2, 4, 5, generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, 5, (2, 4), generator=torch.Generator().manual_seed(1))
    for rare_weight in (0.0, 2.0):
        a, b = logits.clone().requires_grad_(), logits.clone().requires_grad_()
        plain, plain_stats = _by("rare_bucket", rare_weight)(a, y, np.array([0, 0]))
        loss, stats = _objective(COUNTS, rare_weight=rare_weight, **neutral)(b, y, np.array([0, 0]))
        plain.backward()
        loss.backward()
        if not neutral or "focal_gamma" in neutral:  # the very same code path: bit-identical
            assert loss.item() == plain.item() and torch.equal(a.grad, b.grad)
        assert loss.item() == pytest.approx(plain.item(), rel=1e-6)
        assert torch.allclose(a.grad, b.grad, atol=1e-7)
        assert torch.equal(stats, plain_stats)


def test_every_remedy_is_off_at_its_defaults_and_reachable_by_its_own_name():
    from rarelm.objectives.objective import REMEDIES, needs_counts
    from rarelm.objectives.remedy import Context
    from rarelm.params import LossParams

    context = Context(IS_RARE, torch.zeros_like(IS_RARE), COUNTS)
    assert [remedy.from_params(LossParams(), context) for remedy in REMEDIES] == [None] * len(REMEDIES)
    assert not needs_counts(LossParams()) and needs_counts(LossParams(logit_adjust_tau=0.5))
    assert len({remedy.name for remedy in REMEDIES}) == len(REMEDIES)
    objective = _objective(COUNTS, token_weight="face", focal_gamma=1.0)
    assert [r.name for r in objective.remedies] == ["face", "focal"]
    assert objective.face is objective.remedies[0] and objective.agg is None
    with pytest.raises(AttributeError):
        objective.no_such_remedy  # noqa: B018


def test_counts_are_required_where_an_objective_reads_them():
    from rarelm.errors import RarelmError

    for loss in ({"token_weight": "tlat_chi2"}, {"token_weight": "face"}, {"logit_adjust_tau": 1.0}):
        with pytest.raises(RarelmError, match=r"needs the train token counts \(data/rare/counts.npy\)"):
            _objective(None, **loss)


# --------------------------------------------------------------------------- AGG

def _tiny_lm(vocab=5):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=vocab, n_positions=8, n_embd=8, n_layer=1, n_head=2,
                        bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


def test_agg_gates_only_rare_output_rows_exactly_as_computed_by_hand():
    x = torch.tensor([[0, 1, 0, 2, 0, 3]])
    y = torch.tensor([[1, 0, 2, 0, 3, 0]])
    plain_model, agg_model = _tiny_lm(), _tiny_lm()
    # plain run: d loss / d logits and the output layer's input, for the gradient by hand
    seen = {}
    plain_model.lm_head.register_forward_hook(lambda m, i, o: seen.update(h=i[0].detach()))
    logits = plain_model(input_ids=x).logits
    logits.retain_grad()
    _by("rare_bucket", 0.0)(logits, y, np.array([0]))[0].backward()
    g, h = logits.grad.reshape(6, 5), seen["h"].reshape(6, 8)

    objective = _objective(agg=True, agg_alpha=0.03)
    objective.prepare_model(agg_model)
    gate = objective.agg  # 99 steps counted before; with this batch appearances (200, 2, 1, 1, 0) / 100
    gate.memory, gate.steps, gate.window_sum = 100, 99, torch.tensor([197, 1, 0, 0, 0])
    loss, _ = objective(agg_model(input_ids=x).logits, y, np.array([0]))
    loss.backward()
    a = torch.tensor([200, 2, 1, 1, 0]) / 100
    rare = a < 0.03
    assert rare.tolist() == [False, True, True, True, True]
    g1 = torch.where(rare, a, torch.ones(5))
    g2 = torch.where(rare, (a / a[rare].mean()).clamp(max=1), torch.ones(5))
    gates = torch.stack([g2 if rare[t] else g1 for t in y[0]])
    gates[torch.arange(6), y[0]] = 1.0                # a target's own row is never gated
    expected_out = (g * gates).t() @ h
    plain_out = g.t() @ h
    plain_grads = dict(plain_model.named_parameters())
    for name, param in agg_model.named_parameters():
        if name == "transformer.wte.weight":  # tied: input use + gated output use
            want = plain_grads[name].grad - plain_out + expected_out
            assert torch.allclose(param.grad, want, atol=1e-6), name
            assert torch.equal(param.grad[0], plain_grads[name].grad[0])  # a frequent row: untouched
        else:  # everything else sees the hidden states' gradient, which is unchanged
            assert torch.equal(param.grad, plain_grads[name].grad), name
    # token 4: never a target, appearance 0 -> its output row gets no gradient at all
    assert torch.allclose(agg_model.transformer.wte.weight.grad[4],
                          plain_grads["transformer.wte.weight"].grad[4] - plain_out[4], atol=1e-7)


def test_agg_window_keeps_the_last_steps_and_round_trips():
    gate = AdaptiveGradientGate(4, alpha=0.5, memory=3)
    for step in range(5):  # one target of token `step % 4` per step
        gate.observe(torch.tensor([step % 4]))
        gate.step_end()
    assert gate.steps == 5 and len(gate.window) == 2  # K - 1 finished steps; the K-th is the current
    assert gate.window_sum.tolist() == [1, 0, 0, 1]   # steps 3 (token 3) and 4 (token 0)
    gate.observe(torch.tensor([1]))                   # a = (1, 1, 0, 1) / 3
    assert gate.g1.tolist() == pytest.approx([1 / 3, 1 / 3, 0.0, 1 / 3])
    fresh = AdaptiveGradientGate(4, alpha=0.5, memory=3)
    fresh.load_state(gate.state())
    fresh.observe(torch.tensor([1]))
    assert fresh.steps == 5 and torch.equal(fresh.window_sum, gate.window_sum)
    assert torch.equal(fresh.g1, gate.g1) and torch.equal(fresh.g2, gate.g2)


def test_agg_needs_a_linear_output_layer():
    from rarelm.errors import RarelmError

    class NoHead(torch.nn.Module):
        def get_output_embeddings(self):
            return torch.nn.Identity()

    with pytest.raises(RarelmError, match="loss.agg = true needs a linear output layer"):
        _objective(agg=True).prepare_model(NoHead())
