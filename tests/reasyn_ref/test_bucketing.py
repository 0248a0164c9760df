"""Shape buckets: batches to the next power of two, sequences and memories to the next multiple
of 64 (sequences capped at max_len), and the arguments each refuses."""

from __future__ import annotations

import pytest

from reasyn_ref import bucket_batch, bucket_memory, bucket_seq
from reasyn_ref.bucketing import is_batch_bucket, is_seq_bucket


@pytest.mark.parametrize(
    ("n", "expected"),
    [(1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (9, 16), (64, 64), (65, 128), (257, 512)],
)
def test_bucket_batch_is_the_next_power_of_two(n, expected):
    assert bucket_batch(n) == expected


@pytest.mark.parametrize(
    ("n", "error"),
    [(0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError), ("2", TypeError)],
)
def test_bucket_batch_refuses_out_of_range(n, error):
    with pytest.raises(error, match="n must be an int >= 1"):
        bucket_batch(n)


@pytest.mark.parametrize(
    ("length", "max_len", "expected"),
    [
        (1, 512, 64),
        (63, 512, 64),
        (64, 512, 64),
        (65, 512, 128),
        (129, 512, 192),
        (511, 512, 512),
        (512, 512, 512),
        (65, 100, 100),  # capped
        (100, 100, 100),
        (1, 30, 30),  # capped below one bucket
        (1, 1, 1),
    ],
)
def test_bucket_seq_is_the_next_multiple_of_64_capped(length, max_len, expected):
    assert bucket_seq(length, max_len) == expected


@pytest.mark.parametrize(
    ("length", "max_len", "name", "error"),
    [
        (0, 512, "length", ValueError),
        (513, 512, "length", ValueError),
        (True, 512, "length", TypeError),
        (1.0, 512, "length", TypeError),
        (1, 0, "max_len", ValueError),
        (5, True, "max_len", TypeError),
    ],
)
def test_bucket_seq_refuses_out_of_range(length, max_len, name, error):
    with pytest.raises(error, match=rf"bucket_seq: {name} must be"):
        bucket_seq(length, max_len)


@pytest.mark.parametrize(("length", "expected"), [(1, 64), (64, 64), (65, 128), (600, 640)])
def test_bucket_memory_is_the_next_multiple_of_64_uncapped(length, expected):
    assert bucket_memory(length) == expected


@pytest.mark.parametrize(
    ("length", "error"), [(0, ValueError), (True, TypeError), (2.0, TypeError)]
)
def test_bucket_memory_refuses_out_of_range(length, error):
    with pytest.raises(error, match=r"^bucket_memory: length must be an int >= 1"):
        bucket_memory(length)


def test_the_buckets_are_what_bucketing_gives():
    assert [n for n in range(1, 70) if is_batch_bucket(n)] == [1, 2, 4, 8, 16, 32, 64]
    assert {bucket_batch(n) for n in range(1, 65)} == {1, 2, 4, 8, 16, 32, 64}
    assert [n for n in range(1, 201) if is_seq_bucket(n, 200)] == [64, 128, 192, 200]
    assert {bucket_seq(n, 200) for n in range(1, 201)} == {64, 128, 192, 200}
