"""Shape buckets: the few shapes a CUDA-graph cache captures."""

from __future__ import annotations

from .checks import check_int

SEQ_BUCKET = 64


def bucket_batch(n: int) -> int:
    """The next power of two at or above n (n >= 1)."""
    check_int("bucket_batch: n", n, minimum=1)
    return 1 << (n - 1).bit_length()


def bucket_seq(length: int, max_len: int) -> int:
    """The next multiple of 64 at or above length, capped at max_len (1 <= length <= max_len)."""
    check_int("bucket_seq: max_len", max_len, minimum=1)
    check_int("bucket_seq: length", length, minimum=1, maximum=max_len)
    return min(-(-length // SEQ_BUCKET) * SEQ_BUCKET, max_len)


def is_batch_bucket(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def is_seq_bucket(length: int, max_len: int) -> bool:
    return 1 <= length <= max_len and (length % SEQ_BUCKET == 0 or length == max_len)


def bucket_memory(length: int) -> int:
    """Memory (encoder output) length rounded up to a multiple of 64, the graph cache's memory
    bucket; the padded positions are masked out."""
    check_int("bucket_memory: length", length, minimum=1)
    return -(-length // SEQ_BUCKET) * SEQ_BUCKET
