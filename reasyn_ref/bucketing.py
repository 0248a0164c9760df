"""Shape buckets: the few shapes a CUDA-graph cache captures."""

from __future__ import annotations

SEQ_BUCKET = 64


def _check_int(where: str, value: object, rule: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{where} must be {rule}, got {value!r}")


def bucket_batch(n: int) -> int:
    """The next power of two at or above n (n >= 1)."""
    _check_int("bucket_batch: n", n, "an int >= 1")
    if n < 1:
        raise ValueError(f"bucket_batch: n must be an int >= 1, got {n!r}")
    return 1 << (n - 1).bit_length()


def bucket_seq(length: int, max_len: int) -> int:
    """The next multiple of 64 at or above length, capped at max_len (1 <= length <= max_len)."""
    _check_int("bucket_seq: max_len", max_len, "an int >= 1")
    if max_len < 1:
        raise ValueError(f"bucket_seq: max_len must be an int >= 1, got {max_len!r}")
    _check_int("bucket_seq: length", length, f"an int in [1, {max_len}]")
    if not 1 <= length <= max_len:
        raise ValueError(f"bucket_seq: length must be an int in [1, {max_len}], got {length!r}")
    return min(-(-length // SEQ_BUCKET) * SEQ_BUCKET, max_len)


def is_batch_bucket(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def is_seq_bucket(length: int, max_len: int) -> bool:
    return 1 <= length <= max_len and (length % SEQ_BUCKET == 0 or length == max_len)


def bucket_memory(length: int) -> int:
    """Memory (encoder output) length rounded up to a multiple of 64, the graph cache's memory
    bucket; the padded positions are masked out."""
    _check_int("bucket_memory: length", length, "an int >= 1")
    if length < 1:
        raise ValueError(f"bucket_memory: length must be an int >= 1, got {length!r}")
    return -(-length // SEQ_BUCKET) * SEQ_BUCKET
