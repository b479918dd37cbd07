"""A weighted sampler for DistributedDataParallel: every epoch a shuffled low-variance draw.

`torch.utils.data.WeightedRandomSampler` draws independently with replacement
(`torch.multinomial`, which also refuses more than 2^24 categories): at equal
weights an epoch misses ~1/e of the samples, and a sample of weight 2.3 turns up
anywhere from 0 to 7 times. torch has no weighted sampler that shards across
ranks either. This one builds epoch e from (seed, e) alone, in four steps:

1. **Windows move.** With `block_size` B, the epoch's windows start at
   `offset + k * B`. Epoch 0 keeps offset 0 (the windows the weights stage
   scored); epoch e >= 1 takes `1 + floor((B - 1) * frac(phase + e * 0.618...))`,
   a golden-ratio sequence whose phase comes from the seed: consecutive epochs
   never share an offset (for B >= 4), and no epoch after the first cuts where
   epoch 0 cuts, so two neighbouring tokens split by one epoch's window edge sit
   inside one window in other epochs. A window at offset o > 0 holds the tail of
   base window k and the head of base window k + 1, and weighs their blend
   `((B - o) * w[k] + o * w[k + 1]) / B`; the last base window has no successor
   (its tail would run past the scored tokens), so such an epoch has one window
   fewer. B = 1 (the default) means plain items: offset 0, no blending.
2. **Systematic resampling.** An epoch draws as many samples as it has windows,
   n. One uniform u in [0, 1) places n evenly spaced points (j + u) * S / n on the
   cumulative weights C (S their total); window i gets the points that fall on it,
   `ceil(n C_i / S - u) - ceil(n C_{i-1} / S - u)`: its expected count n w_i / S
   rounded down or up, exact in expectation, so a window of weight 2.3 (mean 1) is
   seen 2 or 3 times. Equal weights give every window exactly once (a
   permutation, like `DistributedSampler`); a zero weight is never drawn. The
   cumulative sum runs in chunks of 2^20 windows (float64), so any number of
   windows works and temporary memory is bounded by the chunk.
3. **Shuffle** the drawn multiset with numpy's PCG64 seeded by (seed, epoch).
4. **Shard** like `DistributedSampler`: pad the epoch by wrapping to a multiple
   of num_replicas and give rank r positions r, r + R, r + 2R, ...: disjoint,
   equal lengths, and one step of R ranks consumes the same run of the epoch as
   one process with an R times larger batch. Every rank computes the epoch
   itself, without communication (O(n) time and 8 bytes per window, as
   `DistributedSampler` does).

The sampler hands out **start positions** in the token array
(`offset + window * B`, int64), not window indices; `starts(epoch)` returns
this rank's whole epoch, so a resumed run can slice off what it consumed.
`weights` is an array (the same every epoch) or a function epoch -> array (an
alpha schedule); either way one weight per base window.

    >>> s = WeightedDistributedSampler([1.0, 1.0, 1.0, 1.0], seed=0)
    >>> sorted(s.starts(epoch=0).tolist())          # equal weights: each item once
    [0, 1, 2, 3]
    >>> s = WeightedDistributedSampler([0.0, 1.0, 3.0], seed=0)
    >>> sorted(s.starts().tolist())                 # expected counts 0, 0.75, 2.25
    [1, 2, 2]
    >>> w = WeightedDistributedSampler([1.0, 3.0, 2.0, 2.0], seed=0, block_size=4)
    >>> [w.offset(e) for e in range(4)]
    [0, 3, 2, 1]
    >>> w.window_weights(2).tolist()                # offset 2: (2 * w[k] + 2 * w[k + 1]) / 4
    [2.0, 2.5, 2.0]
    >>> sorted(w.starts(epoch=2).tolist())          # 2 + 4k; expected counts 0.92, 1.15, 0.92
    [2, 6, 10]
    >>> a = WeightedDistributedSampler([1, 1, 1, 1, 1], num_replicas=2, rank=0, seed=0)
    >>> b = WeightedDistributedSampler([1, 1, 1, 1, 1], num_replicas=2, rank=1, seed=0)
    >>> a.order(0).tolist()                         # the epoch, all ranks together
    [2, 4, 3, 0, 1]
    >>> list(a), list(b)                            # padded to 6 by wrapping: 2 again
    ([2, 3, 1], [4, 0, 2])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler

from rarelm.errors import RarelmError

# Windows are summed and drawn in chunks of this many, bounding temporary memory.
_CHUNK = 1 << 20
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0  # 0.618...: frac(e * _GOLDEN) spreads evenly
_OFFSET_STREAM = 1  # SeedSequence spawn key of the offsets' phase (apart from the draws)

Weights = Sequence[float] | np.ndarray
WeightsFn = Callable[[int], Weights]


def check_weights(weights: Weights, what: str = "weights") -> np.ndarray:
    """`weights` as a float64 array, or a RarelmError if they cannot be sampling weights."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1:
        raise RarelmError(f"{what}: must be a 1-D array, got shape {w.shape}")
    if w.size == 0:
        raise RarelmError(f"{what}: is empty")
    if not np.isfinite(w).all():
        raise RarelmError(f"{what}: holds a NaN or infinite value (first at index "
                          f"{int(np.flatnonzero(~np.isfinite(w))[0])})")
    if (w < 0).any():
        raise RarelmError(f"{what}: holds a negative value (first at index "
                          f"{int(np.flatnonzero(w < 0)[0])})")
    if not w.sum() > 0:
        raise RarelmError(f"{what}: all weights are zero")
    return w


def systematic_draw(window_weights: Callable[[int, int], np.ndarray], n: int,
                    u: float) -> np.ndarray:
    """Systematic resampling: n window indices (sorted, int64), window i about n w_i / S times.

    `window_weights(first, last)` gives the weights of windows first..last-1; it is
    called chunk by chunk, twice (the total first, then the draw).

    >>> w = np.array([0.5, 2.3, 0.0, 1.2])
    >>> systematic_draw(lambda a, b: w[a:b], 4, u=0.5).tolist()  # ceil(n C / S - u): 0, 3, 3, 4
    [1, 1, 1, 3]
    >>> systematic_draw(lambda a, b: w[a:b], 4, u=0.9).tolist()  # ceil(n C / S - u): 0, 2, 2, 4
    [1, 1, 3, 3]
    """
    chunks = [(first, min(n, first + _CHUNK)) for first in range(0, n, _CHUNK)]
    total = 0.0
    for first, last in chunks:  # summed exactly as below, so the last C is `total` itself
        total = float(np.cumsum(window_weights(first, last))[-1] + total)
    out = np.empty(n, dtype=np.int64)
    carry, drawn = 0.0, 0
    for first, last in chunks:
        cumulative = np.cumsum(window_weights(first, last)) + carry
        carry = float(cumulative[-1])
        # draws up to and including window i; C_i == S means all n (float rounding aside)
        upto = np.minimum(np.ceil(cumulative * (n / total) - u), n).astype(np.int64)
        upto[cumulative >= total] = n
        counts = np.diff(upto, prepend=drawn)
        out[drawn:upto[-1]] = np.repeat(np.arange(first, last, dtype=np.int64), counts)
        drawn = int(upto[-1])
    return out


class WeightedDistributedSampler(Sampler[int]):
    """Each epoch: a shuffled systematic draw over this epoch's windows, sharded over ranks.

    `weights` holds one weight per base window (an array, or a function of the
    epoch that returns one); `block_size` is the window length in tokens (1:
    plain items, start position = index); `shift_windows=False` keeps every epoch's
    windows at offset 0 (for comparison with fixed windows). See the module docstring.
    """

    def __init__(self, weights: Weights | WeightsFn, num_replicas: int = 1, rank: int = 0,
                 seed: int = 0, block_size: int = 1, shift_windows: bool = True):
        if int(num_replicas) < 1:
            raise RarelmError(f"sampler: num_replicas = {num_replicas} must be >= 1")
        if not 0 <= int(rank) < int(num_replicas):
            raise RarelmError(f"sampler: rank = {rank} must be in [0, {num_replicas})")
        if int(seed) < 0:
            raise RarelmError(f"sampler: seed = {seed} must be >= 0")
        if int(block_size) < 1:
            raise RarelmError(f"sampler: block_size = {block_size} must be >= 1")
        self._fixed = None if callable(weights) else check_weights(weights)
        self._weights_fn = weights if callable(weights) else None
        self._cache: tuple[int | None, np.ndarray | None] = (None, None)  # the last epoch's
        self.num_weights = len(self.weights(0))
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.seed = int(seed)
        self.block_size = int(block_size)
        self.shift_windows = bool(shift_windows)
        self.epoch = 0
        spawn = np.random.SeedSequence(self.seed, spawn_key=(_OFFSET_STREAM,))
        self._phase = float(spawn.generate_state(1, np.uint64)[0]) / 2.0**64

    def weights(self, epoch: int) -> np.ndarray:
        """The base windows' weights for `epoch` (checked; the last epoch's are cached)."""
        if self._fixed is not None:
            return self._fixed
        if self._cache[0] != epoch:
            w = check_weights(self._weights_fn(epoch), f"weights of epoch {epoch}")
            if self._cache[0] is not None and len(w) != self.num_weights:
                raise RarelmError(f"weights of epoch {epoch}: {len(w)} values, epoch 0 had "
                                  f"{self.num_weights}")
            self._cache = (epoch, w)
        return self._cache[1]

    def offset(self, epoch: int) -> int:
        """Where the epoch's first window starts, in [0, block_size): 0 at epoch 0."""
        if epoch == 0 or not self.shift_windows or self.block_size == 1 or self.num_weights < 2:
            return 0
        return 1 + int((self.block_size - 1) * ((self._phase + epoch * _GOLDEN) % 1.0))

    def num_windows(self, epoch: int) -> int:
        """Windows of the epoch (all ranks): one fewer than base windows at an offset > 0."""
        return self.num_weights - (self.offset(epoch) > 0)

    def window_weights(self, epoch: int, first: int = 0, last: int | None = None) -> np.ndarray:
        """Weights of the epoch's windows first..last-1: base weights blended by the offset."""
        w, o, block = self.weights(epoch), self.offset(epoch), self.block_size
        last = self.num_windows(epoch) if last is None else last
        if o == 0:
            return w[first:last]
        return ((block - o) * w[first:last] + o * w[first + 1:last + 1]) / block

    def order(self, epoch: int) -> np.ndarray:
        """The epoch's windows (indices at its offset) in drawn order, all ranks together."""
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, epoch])))
        u = rng.random()
        n, w = self.num_windows(epoch), self.weights(epoch)
        if w.min() == w.max():  # equal weights: every window once (and exactly so)
            drawn = np.arange(n, dtype=np.int64)
        else:
            drawn = systematic_draw(lambda a, b: self.window_weights(epoch, a, b), n, u)
        rng.shuffle(drawn)
        return drawn

    def starts(self, epoch: int | None = None) -> np.ndarray:
        """This rank's window start positions for `epoch` (default: the current one), int64."""
        epoch = self.epoch if epoch is None else int(epoch)
        if epoch < 0:
            raise RarelmError(f"sampler: epoch = {epoch} must be >= 0")
        order = self.order(epoch)
        n, per_rank = len(order), -(-len(order) // self.num_replicas)
        mine = order[self.rank::self.num_replicas]
        if len(mine) < per_rank:  # the padding: this rank's last position wraps around
            mine = np.append(mine, order[(self.rank + len(mine) * self.num_replicas) % n])
        return self.offset(epoch) + mine * self.block_size

    def __len__(self) -> int:
        return -(-self.num_windows(self.epoch) // self.num_replicas)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        starts = self.starts()
        for first in range(0, len(starts), _CHUNK):
            yield from starts[first:first + _CHUNK].tolist()
