"""rare_terms.buckets: token counts and the frequency buckets, by hand."""

from __future__ import annotations

import numpy as np
import pytest

from rarelm.errors import RarelmError
from rarelm.rare_terms.buckets import bucket_tokens, count_tokens


def test_count_tokens_in_chunks_equals_bincount():
    tokens = np.random.default_rng(0).integers(0, 50, size=10_000).astype(np.uint16)
    counts = count_tokens(tokens, 60, chunk_tokens=1024)
    assert counts.dtype == np.int64 and counts.tolist() == np.bincount(tokens, minlength=60).tolist()


def test_count_tokens_rejects_an_id_outside_the_vocabulary():
    with pytest.raises(RarelmError, match="token id 9 .* outside the vocabulary of 5"):
        count_tokens(np.array([1, 2, 9], dtype=np.uint16), 5, chunk_tokens=1024)


def test_buckets_by_hand():
    # 100 occurrences. Descending 50, 30 reach 80% -> frequent = count >= 30.
    # Ascending 2, 3, 5 cover 10 <= 10% (adding 10 would make 20) -> rare = count <= 5.
    counts = np.array([0, 50, 30, 10, 5, 3, 2])
    buckets, summary = bucket_tokens(counts, frequent_share=0.8, rare_share=0.1)
    assert buckets.dtype == np.int8
    assert buckets.tolist() == [3, 0, 0, 1, 2, 2, 2]
    assert summary["frequent_min_count"] == 30 and summary["rare_max_count"] == 5
    assert summary["frequent"] == {"tokens": 2, "occurrences": 80, "share": 0.8}
    assert summary["medium"] == {"tokens": 1, "occurrences": 10, "share": 0.1}
    assert summary["rare"] == {"tokens": 3, "occurrences": 10, "share": 0.1}
    assert summary["unseen"] == {"tokens": 1, "occurrences": 0, "share": 0.0}


def test_equal_counts_share_a_bucket():
    # 40 reaches 70% at the first 40 -> every token with count 40 is frequent, covering 80%;
    # rare: count-1 tokens cover 2/100 <= 5%, count 8 would make 10%.
    counts = np.array([40, 40, 10, 8, 1, 1])
    buckets, _ = bucket_tokens(counts, frequent_share=0.7, rare_share=0.05)
    assert buckets.tolist() == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize(("shares", "empty"), [((0.8, 0.001), "rare"), ((0.6, 0.2), "medium")])
def test_thresholds_that_leave_a_bucket_empty(shares, empty):
    counts = np.array([50, 30, 10, 5, 3, 2])
    with pytest.raises(RarelmError, match=f"leave the {empty} bucket empty"):
        bucket_tokens(counts, *shares)
