"""Which targets count more (`loss.targets`): the rare bucket, term occurrences, or both.

* rare_bucket: the target token is in the rare frequency bucket (data/rare/buckets.npy);
* terms: the target position is a token of an extracted term's occurrence
  (data/rare/term_index.npy), so every token of "myocardial infarction"
  counts, including a medium-frequency modifier, and a number or a one-off
  word does not;
* both: either;
* terms_after_first: the tokens of a term occurrence after its first ("infarction" of
  "myocardial infarction", not "myocardial"): where a term is already under way. The
  first token is where the model decides to start the term at all; weighting it more
  teaches the model to start terms more often (false insertion, and the cost to
  general text), weighting only the continuation does not (the remedy aimed at the
  trade of issue 22). A term of one token has no such target.

`loss.rare_weight` (rarelm/objectives/rare_weight.py) and `loss.frequent_unlikelihood` act
on the selected targets, `loss.kl_base` on the others.
"""

from __future__ import annotations

import numpy as np
import torch

FREQUENT_BUCKET, RARE_BUCKET = 0, 2  # data/rare/buckets.npy: 0 frequent, 1 medium, 2 rare, 3 unseen
TARGET_CHOICES = ("rare_bucket", "terms", "both", "terms_after_first")


def rare_mask(buckets, vocab_size: int, bucket: int = RARE_BUCKET) -> torch.Tensor:
    """Bool [vocab_size]: True for token ids in `bucket` (ids past the buckets: False)."""
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    b = torch.from_numpy(np.array(buckets[:vocab_size], dtype=np.int64))
    mask[:len(b)] = b == bucket
    return mask


class TargetSelection:
    """The selected targets of a batch, from its targets and the train positions its windows start at.

    >>> from rarelm.artifacts.term_index import TermIndex
    >>> index = TermIndex(np.array([[2, 2, 0]]), max_length=2)  # a term on positions 2, 3
    >>> is_rare = torch.tensor([False, False, True])          # token 2 is in the rare bucket
    >>> y = torch.tensor([[2, 0, 1]])                          # targets at positions 1, 2, 3
    >>> [TargetSelection(t, is_rare, index)(y, np.array([0])).tolist()
    ...  for t in ("rare_bucket", "terms", "both", "terms_after_first")]
    [[[True, False, False]], [[False, True, True]], [[True, True, True]], [[False, False, True]]]
    """

    def __init__(self, targets: str, is_rare: torch.Tensor, term_index=None):
        if targets not in TARGET_CHOICES:
            raise ValueError(f"loss.targets = {targets!r}")
        if targets != "rare_bucket" and term_index is None:
            raise ValueError(f"loss.targets = {targets} needs the term index")
        self.targets, self.is_rare, self.term_index = targets, is_rare, term_index

    def __call__(self, y: torch.Tensor, starts: np.ndarray) -> torch.Tensor:
        """Bool [B, T] for targets y [B, T] of windows starting at `starts` (int64 [B])."""
        rare = self.is_rare[y]
        if self.targets == "rare_bucket":
            return rare
        skip_first = self.targets == "terms_after_first"
        terms = _to_device(self.term_index.target_mask(starts, y.size(1), skip_first), y.device)
        return terms | rare if self.targets == "both" else terms


def _to_device(mask: np.ndarray, device) -> torch.Tensor:
    """The host mask on `device`; to a GPU through pinned memory, without waiting for the GPU (a
    plain copy from pageable memory waits for every kernel queued before it)."""
    tensor = torch.from_numpy(mask)
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
