"""The training objective (rarelm/loss.py): which targets count more, by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rarelm.loss import Objective, rare_weighted_loss
from rarelm.rare import TermIndex


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


@pytest.mark.parametrize(("targets", "expected"), [
    ("rare_bucket", (1 * 1.0 + 3 * 3.0 + 1 * 2.0) / (1 + 3 + 1)),  # 2.4
    ("terms", (1 * 1.0 + 3 * 3.0 + 3 * 2.0) / (1 + 3 + 3)),       # 16 / 7
    ("both", (1 * 1.0 + 3 * 3.0 + 3 * 2.0) / (1 + 3 + 3)),
])
def test_each_target_choice_by_hand(targets, expected):
    loss, stats = Objective(targets, 2.0, IS_RARE, INDEX)(logits_with_ce([0, 1, 2], CE), Y, np.array([0]))
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    # the logged sums are those of the rare bucket, whatever is weighted
    assert stats.tolist() == pytest.approx([6.0, 3.0, 3.0, 1.0], rel=1e-6)


def test_both_is_the_union_of_rare_targets_and_term_targets():
    y = torch.tensor([[1, 0, 0], [0, 1, 0]])
    starts = np.array([0, 5])  # the term covers positions 2 and 3: targets 1, 2 of the first window only
    masks = {t: Objective(t, 1.0, IS_RARE, INDEX).selected(y, starts).tolist()
             for t in ("rare_bucket", "terms", "both")}
    assert masks == {"rare_bucket": [[True, False, False], [False, True, False]],
                     "terms": [[False, True, True], [False, False, False]],
                     "both": [[True, True, True], [False, True, False]]}


def test_a_term_across_the_window_edge_counts_where_its_tokens_are():
    index = TermIndex(np.array([[3, 3, 0]]), max_length=3)  # positions 3, 4, 5
    mask = Objective("terms", 1.0, IS_RARE, index).selected(torch.zeros(2, 3, dtype=torch.long),
                                                            np.array([0, 3]))
    assert mask.tolist() == [[False, False, True], [True, True, False]]  # targets 1-3, then 4-6


def test_rare_weight_zero_ignores_the_targets_choice():
    logits = logits_with_ce([0, 1, 2], CE)
    plain, _ = rare_weighted_loss(logits, Y, IS_RARE, 0.0)
    for targets in ("rare_bucket", "terms", "both"):
        loss, _ = Objective(targets, 0.0, IS_RARE, INDEX)(logits, Y, np.array([0]))
        assert loss.item() == pytest.approx(plain.item()) == pytest.approx(2.0)


def test_terms_need_the_index():
    with pytest.raises(ValueError, match="needs the term index"):
        Objective("terms", 1.0, IS_RARE, None)
