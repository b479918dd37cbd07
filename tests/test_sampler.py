"""WeightedDistributedSampler: exact proportions, sharding, determinism, size."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from rarelm.errors import RarelmError
from rarelm.sampler import WeightedDistributedSampler


def test_draw_matches_weights_chi_square():
    weights = np.array([1.0, 2.0, 3.0, 0.0, 10.0, 4.0])
    draws = WeightedDistributedSampler(weights, seed=7, num_samples=200_000).indices()
    observed = np.bincount(draws, minlength=len(weights))
    assert observed[3] == 0  # zero weight: never drawn
    keep = weights > 0
    expected = weights[keep] / weights.sum() * len(draws)
    _, p_value = stats.chisquare(observed[keep], expected)
    assert p_value > 0.01, (observed, expected)


def test_draw_equals_inverse_cdf_of_numpy_uniforms():
    """The documented algorithm: searchsorted(cumsum(w), u * sum(w)), u from PCG64(seed, epoch)."""
    weights = np.random.default_rng(0).random(50)
    got = WeightedDistributedSampler(weights, seed=3, num_samples=5000).indices(epoch=4)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([3, 4])))
    cdf = np.cumsum(weights)
    assert np.array_equal(got, np.searchsorted(cdf, rng.random(5000) * cdf[-1], side="right"))


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_shards_are_disjoint_equal_and_cover_the_global_draw(world):
    weights = np.arange(1, 1001, dtype=float)
    shards = [WeightedDistributedSampler(weights, num_replicas=world, rank=r, seed=1) for r in range(world)]
    per_rank = -(-1000 // world)  # ceil
    assert all(len(s) == per_rank and len(s.indices()) == per_rank for s in shards)
    whole = WeightedDistributedSampler(weights, seed=1, num_samples=per_rank * world).indices()
    # positions r*per_rank .. (r+1)*per_rank-1 of the global draw belong to rank r alone
    assert np.array_equal(np.concatenate([s.indices() for s in shards]), whole)


def test_shard_over_chunk_boundaries():
    """Ranks skip ahead inside the generator; check it across the 2^20 search chunk."""
    weights = np.random.default_rng(1).random(300)
    n = (1 << 20) + 123
    whole = WeightedDistributedSampler(weights, seed=2, num_samples=2 * n).indices()
    second = WeightedDistributedSampler(weights, num_replicas=2, rank=1, seed=2, num_samples=n)
    assert np.array_equal(second.indices(), whole[n:])


def test_deterministic_and_epoch_dependent():
    weights = np.random.default_rng(2).random(500)
    a = WeightedDistributedSampler(weights, num_replicas=2, rank=1, seed=9)
    b = WeightedDistributedSampler(weights, num_replicas=2, rank=1, seed=9)
    assert list(a) == list(b) == a.indices().tolist()
    assert a.indices().dtype == np.int64
    first = a.indices()
    a.set_epoch(1)
    assert not np.array_equal(a.indices(), first)
    assert np.array_equal(a.indices(), b.indices(epoch=1))
    assert np.array_equal(a.indices(epoch=0), first)
    other_seed = WeightedDistributedSampler(weights, num_replicas=2, rank=1, seed=10)
    assert not np.array_equal(other_seed.indices(), first)


def test_more_than_2_24_weights():
    n = 2**24 + 2**20
    weights = np.ones(n, dtype=np.float32)  # float32 in, float64 inside
    weights[-1] = n - 1  # index n-1 alone holds half the mass
    draws = WeightedDistributedSampler(weights, seed=0, num_samples=100_000).indices()
    assert draws.min() >= 0 and draws.max() < n
    last = (draws == n - 1).mean()
    assert abs(last - 0.5) < 0.01
    beyond = ((draws >= 2**24) & (draws < n - 1)).mean()  # uniform part above 2^24
    assert abs(beyond - (2**20 - 1) / (2 * (n - 1))) < 0.005
    with pytest.raises(RuntimeError):  # what this sampler exists for
        torch.multinomial(torch.ones(2**24 + 1), 1, True)


def test_works_with_a_dataloader():
    data = torch.arange(10)
    sampler = WeightedDistributedSampler([0.0] * 9 + [1.0], num_samples=4)
    loader = torch.utils.data.DataLoader(data, batch_size=2, sampler=sampler)
    assert [b.tolist() for b in loader] == [[9, 9], [9, 9]]


@pytest.mark.parametrize("weights, message", [
    ([[1.0, 2.0]], "1-D"),
    ([], "empty"),
    ([1.0, float("nan")], "NaN"),
    ([1.0, float("inf")], "NaN or infinite"),
    ([1.0, -0.5], "negative"),
    ([0.0, 0.0], "all weights are zero"),
])
def test_bad_weights(weights, message):
    with pytest.raises(RarelmError, match=message):
        WeightedDistributedSampler(weights)


@pytest.mark.parametrize("kwargs", [dict(num_replicas=0), dict(num_replicas=2, rank=2),
                                    dict(rank=-1), dict(seed=-1), dict(num_samples=-1)])
def test_bad_arguments(kwargs):
    with pytest.raises(RarelmError):
        WeightedDistributedSampler([1.0, 2.0], **kwargs)
