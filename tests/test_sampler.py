"""WeightedDistributedSampler: systematic draws, permutations, moving windows, shards, size."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from rarelm.errors import RarelmError
from rarelm.train.batches import SampleStream
from rarelm.train.sampler import WeightedDistributedSampler, systematic_draw
from rarelm.weights.scoring import alpha_at, log_scores, weights_from_scores


def counts_of(sampler: WeightedDistributedSampler, epoch: int) -> np.ndarray:
    """How often each window of the epoch (at its offset) was drawn."""
    return np.bincount(sampler.order(epoch), minlength=sampler.num_windows(epoch))


def test_systematic_draw_matches_weights_chi_square():
    weights = np.array([1.0, 2.0, 3.0, 0.0, 10.0, 4.0])
    sampler = WeightedDistributedSampler(weights, seed=7)
    epochs = 5_000
    observed = sum(counts_of(sampler, e) for e in range(epochs))
    assert observed[3] == 0  # zero weight: never drawn
    keep = weights > 0
    expected = weights[keep] / weights.sum() * len(weights) * epochs
    _, p_value = stats.chisquare(observed[keep], expected)
    assert p_value > 0.01, (observed, expected)


def test_each_window_is_drawn_its_expected_count_rounded_down_or_up():
    """Low variance: a window of weight 2.3 (mean 1) is drawn 2 or 3 times, never 0 or 7."""
    weights = np.random.default_rng(0).lognormal(0.0, 1.0, 5000)
    sampler = WeightedDistributedSampler(weights, seed=1)
    expected = weights / weights.sum() * len(weights)
    for epoch in range(3):
        counts = counts_of(sampler, epoch)
        assert counts.sum() == len(weights)
        assert np.all((counts == np.floor(expected)) | (counts == np.ceil(expected)))
        # the draws up to any window are within one of their expectation
        assert np.abs(np.cumsum(counts) - np.cumsum(expected)).max() < 1 + 1e-9


def test_systematic_draw_follows_the_documented_formula_across_chunks():
    """ceil(n C_i / S - u) draws up to window i, over more than one 2^20-window chunk."""
    weights = np.random.default_rng(2).random((1 << 20) + 777)
    weights[::97] = 0.0
    n, u = len(weights), 0.37
    got = systematic_draw(lambda a, b: weights[a:b], n, u)
    upto = np.minimum(np.ceil(np.cumsum(weights) * (n / weights.sum()) - u), n)
    expected = np.diff(upto.astype(np.int64), prepend=0)
    counts = np.bincount(got, minlength=n)
    assert np.all(np.diff(got) >= 0) and counts.sum() == n
    assert np.abs(counts - expected).sum() <= 4  # float rounding of two summation orders
    assert counts[::97].sum() == 0


@pytest.mark.parametrize("value", [1.0, 0.1, 3.7])
def test_equal_weights_make_every_epoch_a_permutation(value):
    sampler = WeightedDistributedSampler(np.full(1000, value), seed=3, block_size=16)
    for epoch in range(4):
        order = sampler.order(epoch)
        assert np.array_equal(np.sort(order), np.arange(sampler.num_windows(epoch)))
    assert not np.array_equal(sampler.order(1), sampler.order(2))  # shuffled anew


def test_offsets_move_by_epoch_and_are_reproducible():
    block = 128
    sampler = WeightedDistributedSampler(np.ones(50), seed=11, block_size=block)
    offsets = [sampler.offset(e) for e in range(200)]
    assert offsets[0] == 0  # epoch 0: the windows the weights stage scored
    assert all(1 <= o < block for o in offsets[1:])
    assert all(a != b for a, b in zip(offsets, offsets[1:], strict=False))  # consecutive differ
    assert len(set(offsets[:60])) == 60  # spread over the block, not a few values
    again = WeightedDistributedSampler(np.ones(50), seed=11, block_size=block)
    assert [again.offset(e) for e in range(200)] == offsets
    other = WeightedDistributedSampler(np.ones(50), seed=12, block_size=block)
    assert [other.offset(e) for e in range(1, 20)] != offsets[1:20]
    for epoch in (0, 1, 5):  # starts sit on the epoch's grid, and whole windows fit
        starts = sampler.starts(epoch)
        assert np.all(starts % block == offsets[epoch])
        assert starts.max() + block + 1 <= 50 * block + 1


def test_fixed_windows_when_shifting_is_off():
    sampler = WeightedDistributedSampler(np.ones(50), seed=11, block_size=16, shift_windows=False)
    for epoch in range(5):
        assert sampler.offset(epoch) == 0 and sampler.num_windows(epoch) == 50
        assert sorted(sampler.starts(epoch).tolist()) == list(range(0, 50 * 16, 16))


def test_no_pair_of_neighbouring_tokens_is_split_in_both_of_two_epochs():
    block = 32
    sampler = WeightedDistributedSampler(np.ones(20), seed=0, block_size=block)
    cuts = [set(sampler.starts(e).tolist()) for e in (0, 1)]  # no context crosses a start
    assert cuts[0] and cuts[1] and not cuts[0] & cuts[1]


def test_window_weights_blend_the_two_base_windows():
    base = np.array([1.0, 3.0, 2.0, 6.0, 0.0])
    sampler = WeightedDistributedSampler(base, seed=4, block_size=8)
    epoch = 1
    o = sampler.offset(epoch)
    assert 0 < o < 8 and sampler.num_windows(epoch) == 4
    expected = ((8 - o) * base[:-1] + o * base[1:]) / 8
    assert sampler.window_weights(epoch) == pytest.approx(expected)
    assert np.array_equal(sampler.window_weights(0), base)
    # the draw follows the blended weights: counts over many epochs at this offset
    total = np.zeros(4)
    for e in range(1, 2000):
        if sampler.offset(e) == o:
            total += counts_of(sampler, e)
    share = expected / expected.sum()
    assert total / total.sum() == pytest.approx(share, abs=0.02)


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_shards_are_disjoint_equal_and_cover_the_epoch(world):
    weights = np.random.default_rng(5).random(1001)
    shards = [WeightedDistributedSampler(weights, num_replicas=world, rank=r, seed=1, block_size=4)
              for r in range(world)]
    for epoch in (0, 1):
        order = shards[0].order(epoch)
        padded = -(-len(order) // world) * world
        parts = [s.starts(epoch) for s in shards]
        assert all(len(p) == padded // world for p in parts)
        shards[0].set_epoch(epoch)
        assert len(shards[0]) == padded // world
        # position r + k * world of the (wrapped) epoch belongs to rank r alone
        interleaved = np.stack(parts, axis=1).reshape(-1)
        whole = shards[0].offset(epoch) + np.resize(order, padded) * 4
        assert np.array_equal(interleaved, whole)


def test_deterministic_and_epoch_dependent():
    weights = np.random.default_rng(2).random(500)
    a = WeightedDistributedSampler(weights, num_replicas=2, rank=1, seed=9, block_size=8)
    b = WeightedDistributedSampler(weights, num_replicas=2, rank=1, seed=9, block_size=8)
    assert list(a) == list(b) == a.starts().tolist()
    assert a.starts().dtype == np.int64
    first = a.starts()
    a.set_epoch(1)
    assert not np.array_equal(a.starts(), first)
    assert np.array_equal(a.starts(), b.starts(epoch=1))
    assert np.array_equal(a.starts(epoch=0), first)
    other_seed = WeightedDistributedSampler(weights, num_replicas=2, rank=1, seed=10, block_size=8)
    assert not np.array_equal(other_seed.starts(), first)


def test_alpha_schedule_worked_values():
    assert [round(alpha_at("decay", 0.8, e, 4), 6) for e in range(5)] == [0.7, 0.5, 0.3, 0.1, 0.1]
    assert [round(alpha_at("grow", 0.8, e, 4), 6) for e in range(4)] == [0.1, 0.3, 0.5, 0.7]
    assert alpha_at("constant", 0.8, 7, 4) == 0.8
    assert alpha_at("decay", 0.6, 0, 1) == alpha_at("grow", 0.6, 0, 1) == pytest.approx(0.3)
    with pytest.raises(RarelmError, match="weights.schedule = 'cosine'"):
        alpha_at("cosine", 0.8, 0, 4)


def test_weights_follow_the_schedule_epoch_by_epoch():
    """A function of the epoch as weights: decay from the log scores, as train.py builds it."""
    tokens = np.random.default_rng(6).zipf(1.5, 4 * 200 + 1) % 50
    counts = np.bincount(tokens, minlength=50)
    scores = log_scores(tokens, counts, block_size=4, chunk_tokens=1024)
    calls = []

    def at_epoch(epoch):
        calls.append(epoch)
        return weights_from_scores(scores, alpha_at("decay", 1.0, epoch, 3), 100.0)

    sampler = WeightedDistributedSampler(at_epoch, seed=0, block_size=4)
    assert sampler.num_weights == 200
    spread = [np.ptp(sampler.weights(e)) for e in range(3)]
    assert spread[0] > spread[1] > spread[2] > 0  # alpha 5/6, 1/2, 1/6
    assert np.array_equal(sampler.weights(1), at_epoch(1))
    stream = SampleStream(sampler)
    stream.take(3 * 200)
    assert set(calls) == {0, 1, 2, 3}
    bad = WeightedDistributedSampler(lambda e: np.ones(200 if e == 0 else 199), seed=0)
    with pytest.raises(RarelmError, match="199 values, epoch 0 had 200"):
        bad.starts(epoch=1)


def test_stream_resumed_mid_epoch_continues_the_same_starts():
    weights = np.random.default_rng(7).random(37)
    sampler = WeightedDistributedSampler(weights, num_replicas=3, rank=2, seed=5, block_size=16)
    whole = SampleStream(sampler)
    drawn = np.concatenate([whole.take(5) for _ in range(12)])  # 60 starts, epochs of 13 or 12
    epoch0, epoch1 = sampler.starts(0), sampler.starts(1)
    assert np.array_equal(drawn[:len(epoch0)], epoch0)
    assert np.array_equal(drawn[len(epoch0):len(epoch0) + len(epoch1)], epoch1)
    straddling = drawn[10:15]  # one take() across the epoch 0 -> 1 boundary, two offsets
    assert len(set((straddling % 16).tolist())) == 2
    for stop in (1, 2, 3, 7):
        first = SampleStream(sampler)
        head = np.concatenate([first.take(5) for _ in range(stop)])
        resumed = SampleStream(WeightedDistributedSampler(weights, num_replicas=3, rank=2, seed=5,
                                                          block_size=16))
        resumed.restore(first.state())
        tail = np.concatenate([resumed.take(5) for _ in range(12 - stop)])
        assert np.array_equal(np.concatenate([head, tail]), drawn), stop


def test_more_than_2_24_windows():
    n = 2**24 + 2**20
    weights = np.ones(n, dtype=np.float32)  # float32 in, float64 inside
    weights[-1] = n - 1  # window n-1 alone holds half the mass: n / 2 draws
    sampler = WeightedDistributedSampler(weights, num_replicas=2, rank=1, seed=0)
    starts = sampler.starts()
    assert len(starts) == n // 2 and starts.min() >= 0 and starts.max() == n - 1
    counts = np.bincount(starts, minlength=n)
    assert abs((starts == n - 1).sum() - n / 4) < 0.003 * n  # half of rank 1's share
    assert counts[:-1].max() == 1  # the others: 0 or 1 each (expected 1/2), 2^24 and above too
    beyond = ((starts >= 2**24) & (starts < n - 1)).sum()
    assert abs(beyond - 2**20 / 4) < 0.01 * 2**20
    with pytest.raises(RuntimeError):  # what this sampler exists for
        torch.multinomial(torch.ones(2**24 + 1), 1, True)


def test_works_with_a_dataloader():
    data = torch.arange(10)
    sampler = WeightedDistributedSampler([0.0] * 9 + [1.0])
    loader = torch.utils.data.DataLoader(data, batch_size=5, sampler=sampler)
    assert [b.tolist() for b in loader] == [[9] * 5, [9] * 5]


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
                                    dict(rank=-1), dict(seed=-1), dict(block_size=0)])
def test_bad_arguments(kwargs):
    with pytest.raises(RarelmError):
        WeightedDistributedSampler([1.0, 2.0], **kwargs)
