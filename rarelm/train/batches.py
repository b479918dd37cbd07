"""What the loop trains on: this rank's stream of window start positions, and batches from them.

Training samples are windows of `model.block_size + 1` tokens of the train split.
Each epoch the `WeightedDistributedSampler` (rarelm.train.sampler) moves the window
boundaries by an offset, draws the windows in proportion to their weights, shuffles
and shards them over the ranks; the `SampleStream` hands the loop their start
positions, and `to_batch` reads the windows at them. With `train.replay_share` > 0 a share
of every batch's rows comes from general text instead (rarelm.train.replay).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from rarelm.params import Params, TrainParams
from rarelm.train.replay import ReplayStream, replay_rows, replay_seed
from rarelm.train.sampler import WeightedDistributedSampler
from rarelm.weights.scoring import alpha_at, weights_from_scores


class SampleStream:
    """This rank's endless stream of window start positions: epoch after epoch of its sampler.

    Its whole state is (epoch, position), so a checkpoint can put it back exactly. A
    `take` may straddle two epochs (and so two window offsets). `tokens` is the token array
    the positions address, which `to_batch` reads (rarelm.train.replay.ReplayStream has one
    of its own: the train tokens followed by the replay text's).
    """

    def __init__(self, sampler, tokens=None):
        self.sampler = sampler
        self.tokens = tokens
        self.epoch, self.position = 0, 0
        self._starts = None

    def take(self, n: int) -> np.ndarray:
        """The next `n` start positions in the train token array, int64 [n]."""
        out = []
        while n > 0:
            if self._starts is None:
                self._starts = self.sampler.starts(self.epoch)
            chunk = self._starts[self.position:self.position + n]
            out.append(chunk)
            n -= len(chunk)
            self.position += len(chunk)
            if self.position >= len(self._starts):
                self.epoch, self.position, self._starts = self.epoch + 1, 0, None
        return np.concatenate(out)

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def restore(self, state: dict[str, int]) -> None:
        self.epoch, self.position, self._starts = int(state["epoch"]), int(state["position"]), None


def to_batch(tokens_or_samples, starts: np.ndarray, block_size: int, device) -> tuple[Any, Any]:
    """Inputs and next-token targets [len(starts), block_size] on `device`.

    Row i is tokens[starts[i]:starts[i] + block_size + 1] of a token array (or of a
    `Samples`' tokens), split into inputs (all but the last) and targets (all but the first).

    >>> x, y = to_batch(np.arange(10), np.array([3, 0]), 4, torch.device("cpu"))
    >>> x.tolist(), y.tolist()
    ([[3, 4, 5, 6], [0, 1, 2, 3]], [[4, 5, 6, 7], [1, 2, 3, 4]])
    """
    tokens = getattr(tokens_or_samples, "tokens", tokens_or_samples)
    starts = np.asarray(starts, dtype=np.int64)
    if len(starts) and (starts.min() < 0 or starts.max() + block_size + 1 > len(tokens)):
        raise IndexError(f"a window runs outside the {len(tokens)} tokens: starts "
                         f"{starts.min()}..{starts.max()}, block_size {block_size}")
    rows = starts[:, None] + np.arange(block_size + 1)
    windows = torch.from_numpy(np.asarray(tokens[rows]).astype(np.int64))
    if device.type == "cuda":  # pinned host memory lets the copy overlap with compute
        windows = windows.pin_memory().to(device, non_blocking=True)
    return windows[:, :-1], windows[:, 1:]


def logits_after_lead(model, x, lead: tuple[int, ...] = ()):
    """`model(x).logits` (inside rarelm.train.output's `hidden_states()`, what feeds the output layer)
    with the model's lead (Gemma 3's `<bos>`: rarelm/artifacts/tokenized.py `lead_ids`) read first
    before every window, as the model was pretrained and as evaluate reads it; the lead's own
    positions are left out, so the result lines up with `x` and its targets. No lead: `model(x)`."""
    if not lead:
        return model(input_ids=x, use_cache=False).logits
    head = torch.tensor(lead, dtype=x.dtype, device=x.device).expand(x.size(0), -1)
    return model(input_ids=torch.cat([head, x], dim=1), use_cache=False).logits[:, len(lead):]


def epochs_to_train(tp: TrainParams, world_size: int, n_windows: int) -> int:
    """Epochs the run starts: max_steps * grad_accum * the batch's domain rows per rank (batch_size
    less the general-text replay rows, rarelm.train.replay), rounded up.

    >>> epochs_to_train(TrainParams(max_steps=150, batch_size=16, grad_accum=1), 2, 2880)
    2
    >>> replayed = TrainParams(max_steps=120, batch_size=16, replay_share=0.25, replay_text="r.txt")
    >>> epochs_to_train(replayed, 2, 2880), epochs_to_train(TrainParams(max_steps=120), 2, 2880)
    (1, 2)
    """
    per_rank_epoch = -(-n_windows // world_size)
    domain_rows = tp.batch_size - replay_rows(tp.replay_share, tp.batch_size)
    return max(1, -(-tp.max_steps * domain_rows * tp.grad_accum // per_rank_epoch))


def sampling_weights(params: Params, scores: np.ndarray, n_epochs: int):
    """Epoch -> the windows' weights from their log scores at the epoch's alpha (`alpha_at`)."""
    wp = params.weights

    def at_epoch(epoch: int) -> np.ndarray:
        return weights_from_scores(scores, alpha_at(wp.schedule, params.alpha, epoch, n_epochs),
                                   wp.clip_ratio)

    return at_epoch


def val_windows(n_windows: int, count: int) -> np.ndarray:
    """`count` window indices spread evenly over the val split (the same every time).

    >>> val_windows(10, 4).tolist()
    [0, 3, 6, 9]
    """
    if n_windows == 0:
        return np.zeros(0, dtype=np.int64)
    return np.unique(np.linspace(0, n_windows - 1, num=min(count, n_windows)).astype(np.int64))


def with_replay(stream, params, replay: np.ndarray | None, world_size: int, rank: int):
    """`stream` as it is where replay is off (`train.replay_share` 0), else a `ReplayStream` over the
    replay tokens, with windows of `model.block_size` and their sampler's seed from `replay_seed`."""
    if not params.train.replay_share:
        return stream
    block = params.model.block_size
    sampler = WeightedDistributedSampler(
        np.ones((len(replay) - 1) // block), num_replicas=world_size, rank=rank,
        seed=replay_seed(params.seed), block_size=block, shift_windows=params.weights.shift_windows)
    return ReplayStream(stream, SampleStream(sampler, replay), params.train.replay_share)
